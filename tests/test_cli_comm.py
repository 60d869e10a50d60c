"""The communication options of simulate/compare/draw/explain/export/validate (cli/comm.py), as a user runs them."""

import json

from cli_helpers import fails, run


def test_simulate_with_fsdp_reports_each_kind(capsys):
    rc, out, _ = run(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--fsdp", "2", "--param-bytes", "8",
                     "--intra-bandwidth", "4", "--json")
    res = json.loads(out)
    assert rc == 0 and res["makespan"] > 33
    assert set(res["comm"]) == {"UNSHARD", "REDUCE_GRAD", "STEP_END"}
    assert res["parallelism"]["fsdp"] == 2 and res["parallelism"]["world"] == 8
    for v in res["comm"].values():
        assert [a - x for a, x in zip(v["time"], v["exposed"])] == v["hidden"]
    rc, out, _ = run(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--comms")
    assert rc == 0 and " 33 " in out  # free transfers: today's makespan


def test_compare_and_draw_take_the_layout(capsys, tmp_path):
    rc, out, _ = run(capsys, "compare", "-p", "4", "-m", "8", "--schedules", "1f1b,zb-h1", "--dp", "2",
                     "--param-bytes", "8", "--intra-bandwidth", "4", "--framework", "deepspeed")
    assert rc == 0 and "zb-h1: communication over all ranks: REDUCE_GRAD" in out
    rc, out, _ = run(capsys, "draw", "1f1b", "-p", "2", "-m", "4", "--fsdp", "2", "--param-bytes", "8",
                     "--intra-bandwidth", "1", "-o", str(tmp_path / "t.svg"))
    assert rc == 0 and (tmp_path / "t.svg").exists()


def test_export_comms_then_validate_and_simulate(capsys, tmp_path):
    path = tmp_path / "c.csv"
    rc, out, _ = run(capsys, "export", "interleaved-1f1b", "-p", "2", "-m", "4", "--comms", "--fsdp", "2",
                     "--csv", str(path))
    assert rc == 0 and "0UNSHARD" in path.read_text() and "SEND_F" in path.read_text()
    rc, out, _ = run(capsys, "validate", "--csv", str(path))
    assert rc == 0 and "communication matched" in out
    rc, out, _ = run(capsys, "validate", "zb-v", "-p", "4", "-m", "8", "--fsdp", "2")  # a family, lowered
    assert rc == 0 and out.startswith("valid: zb-v, 4 ranks, its communication matched")
    rc, out, _ = run(capsys, "simulate", "--csv", str(path), "--fsdp", "2", "--param-bytes", "8",
                     "--intra-bandwidth", "2", "--json")
    assert rc == 0 and json.loads(out)["comm"]["UNSHARD"]["time"] == [4.0, 4.0]  # two stages a rank, 8 bytes each over 2 at 2 B/t


def test_bad_comm_input_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n")
    assert "0SEND_F0): no receive on rank 1 takes it" in fails(capsys, "validate", "--csv", str(bad))
    assert "--reshard-after-forward frees FSDP" in fails(capsys, "simulate", "1f1b", "--reshard-after-forward")
    assert "--param-bytes" in fails(capsys, "simulate", "1f1b", "--fsdp", "2", "--param-bytes", "1,2")


def test_simulate_refuses_a_compute_comms_csv_whose_receives_are_out_of_order(capsys, tmp_path):
    bad = tmp_path / "swapped.csv"
    bad.write_text("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                   "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n")
    assert "deadlock: receive order: rank 1 position 0 (1RECV_F1)" in fails(capsys, "simulate", "--csv", str(bad))


def test_a_link_bandwidth_queues_back_to_back_sends_when_lowered(capsys):
    args = ("simulate", "gpipe", "-p", "2", "-m", "4", "--bandwidth", "2", "--boundary-bytes", "4", "--json")
    alone, lowered = (json.loads(run(capsys, *a)[1]) for a in (args, args + ("--comms",)))
    assert alone["makespan"] == 19 and lowered["makespan"] == 22  # 4 sends of 2 t_f each share one link
    assert lowered["comm"]["RECV_F"]["exposed"] == [0.0, 5.0]


def test_costs_per_rank_share_the_weights_among_a_ranks_chunks(capsys):
    rc, out, _ = run(capsys, "compare", "-p", "4", "-m", "8", "--schedules", "1f1b,interleaved-1f1b", "--fsdp", "2",
                     "--param-bytes", "8", "--intra-bandwidth", "4", "--costs-per", "rank", "--json")
    one, two = json.loads(out)
    assert one["comm"]["UNSHARD"]["time"] == two["comm"]["UNSHARD"]["time"] == [1.0] * 4  # one rank's weights
