"""The fault matrix: the real engine at tp=2 pp=4 (8 worker processes, gloo)
under `diag launch`, one injected fault each; the report must name exactly the
culprit, within 5 s of the stall, with every live rank's stacks, and leave no
process behind. `diag analyze` on the run dir must agree afterwards."""
import json

from helpers.run import ENGINE, PROMPTS, diag, launch

def launch_engine(tmp_path, fault: str | None, engine_args: list[str], timeout: int = 240) -> dict:
    flags = ("--fault", fault) if fault else ()
    return launch(tmp_path, [*ENGINE, *engine_args], *flags, timeout=timeout).body()


def kinds(body: dict) -> list[tuple[str, list[int]]]:
    return [(v["kind"], v["culprit_ranks"]) for v in body["verdicts"]]


def analyze_again(run_dir: str) -> list[tuple[str, list[int]]]:
    proc = diag("analyze", run_dir, "--json")
    return [(v["kind"], v["culprit_ranks"]) for v in json.loads(proc.stdout)["verdicts"]]


def assert_hang_report(body: dict, kind: str, culprit: int) -> dict:
    assert kinds(body) == [(kind, [culprit])], body["stderr"][-3000:]
    verdict = body["verdicts"][0]
    assert verdict["detected_after_s"] <= 5
    assert body["exit_code"] == 1          # a verdict
    live = {row["rank"] for row in body["ranks"] if row["state"] != "dead"}
    assert live <= {int(rank) for rank in body["stacks"]}
    assert analyze_again(body["run_dir"]) == [(kind, [culprit])]
    return verdict


def rows(body: dict) -> dict[int, dict]:
    return {row["rank"]: row for row in body["ranks"]}


def test_rank6_never_reaches_execute_model(tmp_path):
    body = launch_engine(tmp_path, "rank=6,at=execute_model,step=0,kind=hang",
                  PROMPTS + ["--max-tokens", "32"])
    verdict = assert_hang_report(body, "never_reached", 6)
    assert verdict["phase"] == "execute_model"
    assert sorted(verdict["victim_ranks"]) == [0, 1, 2, 3, 4, 5, 7]


def test_rank4_hangs_inside_execute_model(tmp_path):
    body = launch_engine(tmp_path, "rank=4,at=forward,step=5,kind=hang", PROMPTS + ["--max-tokens", "32"])
    verdict = assert_hang_report(body, "stuck_in_phase", 4)
    assert {6, 7} <= set(verdict["victim_ranks"])
    assert rows(body)[6]["phase"] == rows(body)[7]["phase"] == "pp_recv"


def test_rank5_skips_a_tp_collective(tmp_path):
    body = launch_engine(tmp_path, "rank=5,at=forward,step=4,kind=skip_collective",
                  PROMPTS + ["--max-tokens", "32"])
    verdict = assert_hang_report(body, "collective_missing_peers", 5)
    assert verdict["group"] == "tp2" and verdict["seq"] is not None


def test_tp2_rank1_skips_a_collective_and_is_named_by_the_groups_rhythm(tmp_path):
    """With two ranks there is no majority: rank 1's next call (the LM head's
    all_gather) meets rank 0's all_reduce, and the steps' repeating calls say
    which side is off."""
    body = launch_engine(tmp_path, "rank=1,at=forward,step=4,kind=skip_collective",
                  ["--prompt", "hello there", "--max-tokens", "32", "-pp", "1"])
    assert kinds(body) == [("collective_mismatch", [1])], body["stderr"][-3000:]
    assert body["verdicts"][0]["victim_ranks"] == [0]
    assert analyze_again(body["run_dir"]) == [("collective_mismatch", [1])]


def test_pp2_stage0_skips_its_send_and_is_named(tmp_path):
    """At tp=1 the first call after forward is stage 0's pp send: skipped, stage 1
    waits in its recv while stage 0 goes back to wait on the driver, which waits
    on stage 1. Stage 0 went past its side of the pair, so it is the culprit."""
    body = launch_engine(tmp_path, "rank=0,at=forward,step=4,kind=skip_collective",
                  ["--prompt", "hello there", "--max-tokens", "32", "-tp", "1", "-pp", "2"])
    verdict = assert_hang_report(body, "collective_missing_peers", 0)
    assert verdict["victim_ranks"] == [1] and verdict["group"] == "pp"


def test_rank2_killed(tmp_path):
    body = launch_engine(tmp_path, "rank=2,at=execute_model,step=3,kind=crash",
                  PROMPTS + ["--max-tokens", "32"])
    assert kinds(body) == [("dead", [2])], body["stderr"][-3000:]
    assert "SIGKILL" in body["verdicts"][0]["summary"]
    assert body["verdicts"][0]["evidence"]["alive"] is False
    assert [row["state"] for row in body["ranks"] if row["rank"] == 2] == ["dead"]
    assert body["exit_code"] == 4          # the job crashed: a death, no hang
    assert analyze_again(body["run_dir"]) == [("dead", [2])]


def test_rank7_straggles(tmp_path):
    body = launch_engine(tmp_path, "rank=7,at=execute_model,step=all,kind=sleep:1.5",
                  PROMPTS + ["--max-tokens", "6"])
    assert kinds(body) == [("straggler", [7])], body["stderr"][-3000:]
    assert body["exit_code"] == 1      # a verdict, though the job finished (diag launch --help)
    assert analyze_again(body["run_dir"]) == [("straggler", [7])]


def test_rank3_stops_taking_the_broadcast(tmp_path):
    body = launch_engine(tmp_path, "rank=3,at=dequeue,step=6,kind=skip_broadcast",
                  PROMPTS + ["--max-tokens", "32"])
    assert_hang_report(body, "broadcast_not_consumed", 3)


def test_long_chunked_prefill_traffic_gives_no_verdict(tmp_path):
    """Long prompts cut into 32-token chunks, for about 150 steps of tp=2 pp=4; the
    stress script (benchmarks/stress_healthy.py) runs healthy jobs by the hundred."""
    prompts = []
    for i in range(16):
        prompts += ["--prompt", f"request {i}: " + "a long prompt that needs many chunks " * 4]
    body = launch_engine(tmp_path, None, prompts + ["--max-tokens", "32",
                                             "--max-num-batched-tokens", "32",
                                             "--max-num-seqs", "8"], timeout=400)
    assert kinds(body) == [] and body["exit_code"] == 0, body["stderr"][-3000:]
