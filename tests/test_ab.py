"""engineroom ab: interleaved boots of two launch settings, compared over boots.

The verdict rules on constructed samples; then the real llama-server: the same setting twice is
not a real difference, and -t 1 against -t 2 on this CPU is (issue 9, A/B)."""

from __future__ import annotations

import json
import os

import pytest

from engineroom.bench.compare import compare_boot_samples
from engineroom.errors import BadInput
from engineroom.flows.ab import boot_order, describe_settings, parse_arm

from conftest import MACHINE_CHECKS, cli


def _boots(*means_and_noise: tuple[float, float]) -> list[dict]:
    """One boot per (mean, spread): four requests at mean ± spread."""
    return [{"w": {"decode_tps": [m - s, m - s / 3, m + s / 3, m + s]}} for m, s in means_and_noise]


def _row(result: dict) -> dict:
    (row,) = result["rows"]
    return row


def test_a_clear_difference_is_real():
    row = _row(compare_boot_samples(_boots((100, 2), (101, 2)), _boots((150, 2), (149, 2))))
    assert row["verdict"] == "real" and row["delta"] == pytest.approx(49.0)
    assert row["boot_band"] == pytest.approx(9.925 * (0.5 * (1 / 2 + 1 / 2)) ** 0.5, rel=1e-3)   # t(0.995, df 2)
    assert row["boots_a"] == [100.0, 101.0] and row["n_a"] == 8


def test_noise_alone_is_not_real():
    row = _row(compare_boot_samples(_boots((100, 10), (101, 10)), _boots((102, 10), (100, 10))))
    assert row["verdict"] == "not real" and row["why"] == "within the noise band"


def test_a_difference_within_the_boot_to_boot_variation_is_not_real():
    # tight within each boot (so the pooled band is narrow), but the boots of arm A differ by 20
    row = _row(compare_boot_samples(_boots((90, 0.5), (110, 0.5)), _boots((112, 0.5), (114, 0.5))))
    assert abs(row["delta"]) > row["band"]
    assert row["verdict"] == "not real"
    assert row["why"] == "within the boot-to-boot variation (at this spread, about 10 boots an arm would tell)"


def test_boots_that_disagree_on_the_direction_are_not_real():
    # three boots each: pooled B is 7 higher, beyond the band and either arm's spread of 6, but
    # B's slowest boot (105) is below A's fastest (106). (With two boots per arm this cannot
    # happen: a delta beyond both spreads puts every B boot above every A boot.)
    row = _row(compare_boot_samples(_boots((100, 0.2), (100, 0.2), (106, 0.2)),
                                    _boots((105, 0.2), (111, 0.2), (111, 0.2))))
    assert abs(row["delta"]) > max(row["band"], row["boot_spread"])
    assert row["verdict"] == "not real" and row["why"] == "the boots disagree on the direction"


def test_two_boots_a_little_apart_are_not_enough_for_real():
    """Seen in CI: the same setting twice, each arm's boots 1% apart and B's both ahead by 2%, each
    boot tight. Two boots an arm cannot tell that from boot-to-boot luck."""
    row = _row(compare_boot_samples(_boots((100, 0.3), (101, 0.3)), _boots((102.5, 0.3), (103.5, 0.3))))
    assert abs(row["delta"]) > row["band"] and row["verdict"] == "not real"
    assert row["why"] == "within the boot-to-boot variation (at this spread, about 4 boots an arm would tell)"


def test_a_difference_within_the_boot_variation_says_how_many_boots_would_tell():
    # seen on this 2-core VM: -t 2 boots 85-99 tok/s against -t 1 at 74-76; at 3 boots an arm the
    # 99% boot band (18.8) just covers the delta (18.1); the pooled spread says 4 boots would tell
    row = _row(compare_boot_samples(_boots((73.8, 1), (75.2, 1), (75.7, 1)),
                                    _boots((85.3, 1), (94.7, 1), (98.9, 1))))
    assert row["verdict"] == "not real"
    assert row["why"] == "within the boot-to-boot variation (at this spread, about 4 boots an arm would tell)"
    more = _row(compare_boot_samples(_boots((73.8, 1), (75.2, 1), (75.7, 1), (74.5, 1)),
                                     _boots((85.3, 1), (94.7, 1), (98.9, 1), (92.0, 1))))
    assert more["verdict"] == "real"


def test_an_arm_whose_every_boot_was_invalid_compares_nothing():
    """Seen in CI on a busy 2-core VM: every boot of arm B stayed INVALID; the comparison has no row (it
    raised StatisticsError on an empty arm before)."""
    assert compare_boot_samples(_boots((100, 1), (101, 1)), [])["rows"] == []


def test_one_boot_per_arm_cannot_tell():
    row = _row(compare_boot_samples(_boots((100, 1)), _boots((200, 1))))
    assert row["verdict"] == "cannot tell"


def test_boot_order_mirrors_each_pair_and_arms_parse():
    assert boot_order(2) == ["A", "B", "B", "A"]
    assert boot_order(3) == ["A", "B", "B", "A", "A", "B"]
    assert parse_arm("threads=1; extra=-nr --mlock", "A") == {"threads": 1, "extra_args": ("-nr", "--mlock")}
    assert parse_arm("kv_unified=off;kv=q8_0", "B") == {"kv_unified": False, "kv_dtype": "q8_0"}
    # two builds of one engine (`--engine ik_llama.cpp --a bin=... --b bin=...`)
    assert parse_arm("bin=/opt/ik/native/llama-server", "A") == {"engine_bin": "/opt/ik/native/llama-server"}
    assert describe_settings({"engine_bin": "/opt/ik/native/llama-server"}) == "engine_bin=/opt/ik/native/llama-server"
    for bad in ("threads", "colour=red", "threads=two", ""):
        with pytest.raises(BadInput):
            parse_arm(bad, "A")
    with pytest.raises(BadInput):
        boot_order(0)


def test_bad_arm_is_one_sentence_before_any_boot(tmp_path):
    proc = cli("ab", "smollm2-135m", "--a", "threads=1", "--b", "speed=11",
               env={"ENGINEROOM_STATE_DIR": str(tmp_path)})
    assert proc.returncode != 0
    assert "arm B: 'speed=11' is not KEY=VALUE" in proc.stderr and "Traceback" not in proc.stderr


def _ab(tmp_path, a: str, b: str, *more: str) -> dict:
    """Four boots an arm: on this 2-core VM -t 2 varies 71-119 tok/s boot to boot (the client shares
    its cores), so two boots could not call -t 1 against -t 2 real (CI saw 82 vs 125 "not real").
    A boot whose bench says INVALID (seen: -t 2 at decode CV 11%) is booted again, not compared."""
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    proc = cli("ab", "smollm2-135m", "--a", a, "--b", b, "--boots", "4", *more, "--ctx", "1024",
               "--max-tokens", "64", "--runs", "3", "--json", env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["order"][:8] == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert len(out["runs_a"]) + len(out["runs_b"]) + len(out["invalid_boots"]) >= 8
    assert "boot 1/8: arm A" in proc.stderr                              # progress, on stderr with --json too
    assert not os.path.exists(tmp_path / "state" / "server.json")      # every boot was stopped
    rows = [r for r in out["comparison"]["rows"] if r["metric"] == "decode_tps"]
    if not rows:
        # every boot of one arm stayed INVALID, each booted again (seen in CI on a busy 2-core VM, 2026-12-05):
        # ab compares nothing then, and says why per boot; only the machine's own checks may be the why
        assert not out["runs_a"] or not out["runs_b"], json.dumps(out["comparison"])
        reasons = [b["why"] for b in out["invalid_boots"]]
        assert all({w.split(":")[0].strip() for w in why.split("; ")} <= MACHINE_CHECKS for why in reasons), reasons
        pytest.skip(f"not measured: this machine left every boot of an arm INVALID ({reasons[-1]})")
    (decode,) = rows
    decode["invalid_boots"] = out["invalid_boots"]
    return decode


def test_the_same_setting_twice_is_not_a_real_difference(llama_server_binary, smollm2, tmp_path):
    decode = _ab(tmp_path, "threads=2", "threads=2")
    assert decode["verdict"] == "not real", json.dumps(decode)


def test_one_thread_against_two_is_a_real_difference(llama_server_binary, smollm2, tmp_path):
    """CI saw -t 1 at 59 tok/s against -t 2 at 81 called "not real" over four boots an arm (which
    boots, the log did not keep); a run here had one -t 2 boot INVALID (decode CV 11.2%), compared all
    the same. Now INVALID boots are booted again, and an undecided boot band may add two boots an arm."""
    decode = _ab(tmp_path, "threads=1", "threads=2", "--max-boots", "6")
    assert decode["delta_pct"] > 10, json.dumps(decode)          # -t 2 ahead on the pooled mean
    if decode["verdict"] != "real":
        # A 2-core VM shared with the client cannot always show it; ab may then say "not real" only for a
        # reason its own boots show, and not stop while its own estimate says --max-boots would tell.
        # Seen on 2026-12-03 (a VM whose second core came and went): -t 2 boots at 58, 60, 87, 85 against
        # -t 1 at 44-59: B's slowest boot below A's fastest.
        # Seen on 2026-12-04 (this repo's CI): -t 2 boots at 77, 78, 117, 96 against -t 1 at 64-76; the
        # 117 boot widened the 99% boot band (36.3) past the delta (23.2): "about 7 boots an arm would tell".
        # Any other "not real" fails: within the noise band, or an early stop where more boots would tell.
        boots = len(decode["boots_a"])
        if decode["why"] == "the boots disagree on the direction":
            assert min(decode["boots_b"]) < max(decode["boots_a"]), json.dumps(decode)
        else:
            assert decode["why"].startswith("within the boot-to-boot variation"), json.dumps(decode)
            assert abs(decode["delta"]) <= decode["boot_band"], json.dumps(decode)
            needed = decode["boots_needed"]
            assert needed is None or needed > boots, json.dumps(decode)
            assert needed is None or needed > 6 or boots == 6, json.dumps(decode)   # it added boots up to --max-boots


def test_the_ab_table_shows_each_arm_its_boots_and_the_verdict():
    from engineroom.report.ab import ab_text

    result = compare_boot_samples(_boots((100, 1), (101, 1)), _boots((150, 1), (149, 1)))
    result.update(arm_a={"threads": 1}, arm_b={"threads": 2, "extra_args": ["-nr"]}, order=list("ABBA"),
                  model="smollm2-135m", runs_a=[1, 4], runs_b=[2, 3])
    text = ab_text(result)
    assert "A: threads=1 (runs 1, 4); B: threads=2, extra_args=-nr (runs 2, 3); boot order A B B A." in text
    assert "| w | decode_tps | 100.500 (8) | 149.500 (8) | 100.000 / 101.000 | 150.000 / 149.000 |" in text
    assert "**real**" in text and "boot band (99%)" in text


class _StandInBoots:
    """A stand-in for the engine and the bench: no real engine says INVALID on demand, so the
    boots' bench statuses are scripted; the store is real."""

    def __init__(self, monkeypatch, statuses: list[str], verdicts: list[dict]):
        import engineroom.bench as bench_pkg
        import engineroom.bench.compare as compare_mod
        import engineroom.flows.ab as ab_mod
        import engineroom.flows.stages as stages_mod
        from engineroom.flows.runs import BenchOutcome

        self.statuses, self.verdicts, self.compared = list(statuses), list(verdicts), []
        self.launched: list[dict] = []

        class _State:
            url = "http://127.0.0.1:1"

            def __init__(self, args):
                self.args = args

        def start(model, args, **_kw):
            self.launched.append(args.to_dict())
            return _State(args)

        def bench(info, store, plan, *, run_id, progress=None, host=None, api_key=None):
            status = self.statuses.pop(0)
            integrity = [{"name": "cv", "status": "FAIL" if status == "INVALID" else "PASS",
                          "detail": "decode CV over 10%: narrative 11.2%"}]
            return BenchOutcome(run_id, {"status": status, "integrity": integrity})

        def compare_arms(a, b):
            self.compared.append(([run["id"] for run, _ in a], [run["id"] for run, _ in b]))
            return {"rows": [self.verdicts.pop(0) if self.verdicts else {"verdict": "real", "boots_needed": None}]}

        monkeypatch.setattr(stages_mod, "start", start)           # the stage runner's launch, connection, down
        monkeypatch.setattr(stages_mod, "stop", lambda: None)
        monkeypatch.setattr(stages_mod, "client_key", lambda url: None)
        monkeypatch.setattr(stages_mod, "connect", lambda url, api_key=None: None)
        monkeypatch.setattr(stages_mod, "run_conditions", lambda info: {})
        monkeypatch.setattr(ab_mod, "bench", bench)
        monkeypatch.setattr(bench_pkg, "bench_conditions", lambda info, plan: {})
        monkeypatch.setattr(compare_mod, "compare_arms", compare_arms)


def _stand_in_ab(tmp_path, monkeypatch, statuses, verdicts=(), **kw):
    from engineroom.flows.ab import ab
    from engineroom.launchargs import LaunchArgs
    from engineroom.store import Store

    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    stand_in = _StandInBoots(monkeypatch, statuses, list(verdicts))
    said: list[str] = []
    with Store(tmp_path / "results.sqlite") as store:
        outcome = ab(store, "smollm2-135m", arm_a={"threads": 1}, arm_b={"threads": 2}, plan=None,
                     base=LaunchArgs(port=0), say=said.append, **kw)
        statuses = {i: store.get_run(i)["status"] for i in range(1, len(stand_in.launched) + 1)}
    return outcome, stand_in, said, statuses


def test_an_invalid_boot_is_kept_named_and_booted_again_but_never_compared(tmp_path, monkeypatch):
    outcome, stand_in, said, statuses = _stand_in_ab(tmp_path, monkeypatch, ["OK", "INVALID", "OK", "OK", "OK"],
                                                     boots=2)
    assert outcome.order == ["A", "B", "B", "A"]
    assert outcome.runs_a == [1, 5] and outcome.runs_b == [3, 4]             # run 2 was B's INVALID first boot
    assert stand_in.compared == [([1, 5], [3, 4])]
    assert statuses[2] == "INVALID"                                          # kept in the store, as it was
    assert outcome.invalid == [{"arm": "B", "position": 2, "run": 2,
                                "why": "cv: decode CV over 10%: narrative 11.2%"}]
    assert outcome.comparison["invalid_boots"] == outcome.invalid
    assert [a["threads"] for a in stand_in.launched] == [1, 2, 2, 2, 1]
    assert any("run 2 is INVALID (cv: decode CV over 10%" in line for line in said)


def test_a_boot_invalid_every_time_leaves_its_arm_a_boot_short(tmp_path, monkeypatch):
    outcome, stand_in, _, _ = _stand_in_ab(tmp_path, monkeypatch, ["OK", "INVALID", "INVALID", "OK", "OK"],
                                           boots=2, retries=1)
    assert outcome.runs_b == [4] and [b["run"] for b in outcome.invalid] == [2, 3]
    assert stand_in.compared == [([1, 5], [4])]


def test_an_undecided_metric_adds_mirrored_pairs_up_to_max_boots(tmp_path, monkeypatch):
    undecided = {"verdict": "not real", "boots_needed": 3}
    outcome, stand_in, said, _ = _stand_in_ab(tmp_path, monkeypatch, ["OK"] * 6, [undecided], boots=2, max_boots=3)
    assert outcome.order == ["A", "B", "B", "A", "A", "B"] and len(outcome.runs_a) == len(outcome.runs_b) == 3
    assert len(stand_in.compared) == 2 and any("two more boots (A B), up to 3 an arm" in line for line in said)
    # needing more boots than allowed adds none
    outcome, stand_in, _, _ = _stand_in_ab(tmp_path / "2", monkeypatch, ["OK"] * 4,
                                           [{"verdict": "not real", "boots_needed": 5}], boots=2, max_boots=4)
    assert outcome.order == ["A", "B", "B", "A"] and len(stand_in.compared) == 1


def test_the_ab_text_names_the_boots_it_did_not_compare():
    from engineroom.report.ab import ab_text

    result = compare_boot_samples(_boots((100, 1), (101, 1)), _boots((150, 1), (149, 1)))
    result.update(order=list("ABBA"), runs_a=[1, 5], runs_b=[3, 4],
                  invalid_boots=[{"arm": "B", "position": 2, "run": 2, "why": "cv: decode CV over 10%"}])
    assert "- run 2, arm B at boot position 2: cv: decode CV over 10%" in ab_text(result)
