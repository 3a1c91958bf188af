"""benchmarks.kernels: HLO metadata parsing, scope attribution, event summary, and a CPU run."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import kernels

_ADAM = 'metadata={op_name="jit(run)/while/body/eval_jaxpr/adam/mul" source_line=3}'
_HEAD = (
    'metadata={op_name="jit(run)/while/body/eval_jaxpr/vmap(transpose(jvp(online_forward)))'
    '/C51MLP/head/dot_general"}'
)
HLO = f"""\
HloModule jit_run
%fused_computation (p: f32[4]) -> f32[4] {{
  %p = f32[4]{{0}} parameter(0)
  ROOT %m = f32[4]{{0}} multiply(%p, %p), metadata={{op_name="jit(run)/while/body/adam/mul"}}
}}
  %loop_multiply_fusion.9 = f32[4]{{0}} fusion(%x), kind=kLoop, calls=%fc, {_ADAM}
  ROOT %gemm_fusion_dot.11 = f32[4]{{0}} fusion(%y), kind=kCustom, {_HEAD}
  %copy.3 = f32[4]{{0}} copy(%z)
"""


def test_op_names_reads_the_metadata_of_every_named_instruction() -> None:
    names = kernels.op_names(HLO)
    assert names["loop_multiply_fusion.9"] == "jit(run)/while/body/eval_jaxpr/adam/mul"
    assert names["gemm_fusion_dot.11"].endswith("head/dot_general")
    assert names["m"] == "jit(run)/while/body/adam/mul"
    assert "copy.3" not in names  # no metadata: attributed to "other" later


@pytest.mark.parametrize(
    ("op_name", "scope"),
    [
        ("jit(run)/while/body/eval_jaxpr/adam/mul", "adam"),
        ("jit(run)/while/body/eval_jaxpr/vmap(transpose(jvp(online_forward)))/dot", "backward"),
        (
            "jit(run)/while/body/eval_jaxpr/jvp(projection)/jit(c51_project)/pallas_call",
            "projection",
        ),
        ("jit(run)/while/body/eval_jaxpr/per_update/scatter-max", "per_update"),
        ("jit(run)/while/body/jit(dynamic_update_index_in_dim)/dynamic_update_slice", "other"),
        ("", "other"),
    ],
)
def test_scope_of_picks_the_learner_scope_or_backward(op_name: str, scope: str) -> None:
    assert kernels.scope_of(op_name) == scope


def _event(pid: int, op: str, dur: float) -> dict:
    return {"ph": "X", "pid": pid, "name": op, "dur": dur, "args": {"hlo_op": op}}


def test_device_events_prefer_gpu_streams_and_summary_is_per_step() -> None:
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
    ]
    events = meta + [
        _event(1, "loop_multiply_fusion.9", 50.0),  # the host's launch record: not device time
        _event(2, "loop_multiply_fusion.9", 1.0),
        _event(2, "loop_multiply_fusion.9", 3.0),
        _event(2, "gemm_fusion_dot.11", 4.0),
        _event(2, "gemm_fusion_dot.11", 6.0),
        {"ph": "X", "pid": 2, "name": "MemcpyDtoH", "dur": 9.0, "args": {}},  # not an XLA op
    ]
    device = kernels.device_events({"traceEvents": events})
    assert [e["dur"] for e in device] == [1.0, 3.0, 4.0, 6.0]
    summary = kernels.summarise(device, kernels.op_names(HLO), n_steps=2)
    assert summary["kernels_per_step"] == pytest.approx(2.0)
    assert summary["busy_us_per_step"] == pytest.approx(7.0)
    assert summary["scopes"]["backward"] == {"kernels_per_step": 1.0, "us_per_step": 5.0}
    assert summary["scopes"]["adam"] == {"kernels_per_step": 1.0, "us_per_step": 2.0}
    assert [k["kernel"] for k in summary["kernels"]] == [
        "gemm_fusion_dot.11",
        "loop_multiply_fusion.9",
    ]


def test_device_events_fall_back_to_host_thunks_without_a_gpu() -> None:
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}}]
    events = meta + [_event(1, "loop_multiply_fusion.9", 2.0), {"ph": "X", "pid": 1, "dur": 1.0}]
    assert len(kernels.device_events({"traceEvents": events})) == 1


def test_no_command_buffers_flag_reruns_in_a_fresh_process(monkeypatch) -> None:
    seen = []

    def fake(args, capture=False):
        seen.append(list(args))
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(kernels, "_fresh_process_without_command_buffers", fake)
    with pytest.raises(SystemExit) as exit_info:
        kernels.main(["--steps", "3", "--no-command-buffers", "--top", "4"])
    assert exit_info.value.code == 0
    assert seen == [["--steps", "3", "--top", "4"]]
    with pytest.raises(SystemExit):
        kernels.main(["--steps", "0"])  # argparse: one line, exit 2


def test_a_table_from_command_buffers_says_how_to_see_the_kernels() -> None:
    result = {
        "device": "gpu",
        "jax": "0",
        "n_seeds": 1,
        "n_steps": 1,
        "repeats": 1,
        "wall_us_per_step": 10.0,
        "traced_wall_us_per_step": 11.0,
        "busy_us_per_step": 9.0,
        "kernels_per_step": 1.0,
        "command_buffers": True,
        "scopes": {"other": {"kernels_per_step": 1.0, "us_per_step": 9.0}},
        "kernels": [
            {
                "kernel": "command_buffer_5",
                "scope": "other",
                "launches_per_step": 1.0,
                "us_per_step": 9.0,
                "op_name": "",
            }
        ],
    }
    assert "--no-command-buffers" in kernels.table(result)


def test_bad_json_path_and_a_failed_profile_process_are_one_line_errors(
    tmp_path, monkeypatch, capsys
) -> None:
    for json_path, problem in ((tmp_path, "a directory"), ("/dev/null/k.json", "not a directory")):
        with pytest.raises(SystemExit) as exit_info:
            kernels.main(["--json", str(json_path)])
        assert exit_info.value.code == 2
        assert problem in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        kernels.main(["--hlo", str(tmp_path / "missing" / "step.hlo")])
    assert exit_info.value.code == 2
    assert "--hlo" in capsys.readouterr().err

    def failing(args, capture=False):
        return subprocess.CompletedProcess(args, 1, "", "Traceback ...\nValueError: boom\n")

    monkeypatch.setattr(kernels, "_fresh_process_without_command_buffers", failing)
    with pytest.raises(RuntimeError, match="(?s)kernel profile failed: .*boom"):
        kernels.run_without_command_buffers(n_steps=2)


def test_a_bad_config_override_is_a_one_line_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        kernels.main(["--steps", "3", "--set", "accel.kernels=triton"])
    assert exit_info.value.code == 2
    assert "accel.kernels" in capsys.readouterr().err
