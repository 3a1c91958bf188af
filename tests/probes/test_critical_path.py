"""benchmarks.critical_path: the longest kernel chain of a scan body, on hand-counted HLO and on
the real (CPU-compiled) learner scan."""

from __future__ import annotations

import pytest

from benchmarks import critical_path

_ADAM = 'metadata={op_name="jit(run)/while/body/eval_jaxpr/adam/mul"}'

# The scan body, hand-counted. Kernels: the counter's add `next`, a, b, c and the add `sum` at the
# top level, f1, f2, f3 inside the command-buffer call: 8. Chains into the root: next (1);
# a -> b -> sum (3); f1 -> c -> sum (3: only f1 leaves through element 0 of the call's tuple);
# f1 -> f2 -> f3 (3, through element 1). Longest: 3. bitcast and constant launch nothing.
HLO = f"""\
HloModule jit_run, is_scheduled=true

%fused_neg (p.1: f32[4]) -> f32[4] {{
  %p.1 = f32[4]{{0}} parameter(0)
  ROOT %n.1 = f32[4]{{0}} negate(%p.1)
}}

%command_buffer (q.0: f32[4]) -> (f32[4], f32[4]) {{
  %q.0 = f32[4]{{0}} parameter(0)
  %f1 = f32[4]{{0}} fusion(%q.0), kind=kLoop, calls=%fused_neg
  %f2 = f32[4]{{0}} fusion(%f1), kind=kLoop, calls=%fused_neg
  %f3 = f32[4]{{0}} fusion(%f2), kind=kLoop, calls=%fused_neg, {_ADAM}
  ROOT %t.0 = (f32[4]{{0}}, f32[4]{{0}}) tuple(%f1, %f3)
}}

%body (arg: (s32[], f32[4], f32[4])) -> (s32[], f32[4], f32[4]) {{
  %arg = (s32[], f32[4]{{0}}, /*index=2*/f32[4]{{0}}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[4]{{0}} get-tuple-element(%arg), index=1
  %y = f32[4]{{0}} get-tuple-element(%arg), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %a = f32[4]{{0}} fusion(%x), kind=kLoop, calls=%fused_neg
  %b = f32[4]{{0}} fusion(%a), kind=kLoop, calls=%fused_neg
  %cb = (f32[4]{{0}}, f32[4]{{0}}) call(%y), to_apply=%command_buffer
  %early = f32[4]{{0}} get-tuple-element(%cb), index=0
  %late = f32[4]{{0}} get-tuple-element(%cb), index=1
  %c = f32[4]{{0}} fusion(%early), kind=kLoop, calls=%fused_neg
  %cast = f32[4]{{0}} bitcast(%c)
  %sum = f32[4]{{0}} add(%b, %cast)
  ROOT %out = (s32[], f32[4]{{0}}, f32[4]{{0}}) tuple(%next, %sum, %late)
}}

%cond (carg: (s32[], f32[4], f32[4])) -> pred[] {{
  %carg = (s32[], f32[4]{{0}}, /*index=2*/f32[4]{{0}}) parameter(0)
  %ci = s32[] get-tuple-element(%carg), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}}

ENTRY %main (e: (s32[], f32[4], f32[4])) -> (s32[], f32[4], f32[4]) {{
  %e = (s32[], f32[4]{{0}}, /*index=2*/f32[4]{{0}}) parameter(0)
  ROOT %w = (s32[], f32[4]{{0}}, f32[4]{{0}}) while(%e), condition=%cond, body=%body, \
backend_config={{"known_trip_count":{{"n":"7"}}}}
}}
"""


def test_parse_instr_reads_tuple_shapes_operands_and_called_computations() -> None:
    parsed = critical_path.parse_instr(
        "  ROOT %w = (s32[], f32[4]{0}, /*index=2*/f32[4]{0}) while(%e), condition=%cond, "
        'body=%body, backend_config={"known_trip_count":{"n":"7"}}'
    )
    assert parsed is not None
    instr, is_root = parsed
    assert is_root
    assert (instr.name, instr.opcode, instr.operands) == ("w", "while", ("e",))
    assert instr.called == {"condition": ("cond",), "body": ("body",)}
    assert instr.trip_count == 7
    gte, _ = critical_path.parse_instr("  %late = f32[4]{0} get-tuple-element(%cb), index=1")
    assert (gte.opcode, gte.operands, gte.tuple_index) == ("get-tuple-element", ("cb",), 1)
    assert critical_path.parse_instr("HloModule jit_run") is None


def test_the_hand_counted_body_has_eight_kernels_and_a_chain_of_three() -> None:
    result = critical_path.analyse(HLO)
    assert result["body"] == "body"
    assert result["kernels"] == 8
    assert result["depth"] == 3
    # Three chains are 3 long; the one reported is one of them, in order.
    labels = [k["kernel"].split(" ")[0] for k in result["chain"]]
    assert labels in (["a", "b", "sum"], ["f1", "c", "sum"], ["f1", "f2", "f3"])


def test_a_call_output_keeps_each_tuple_element_s_own_chain() -> None:
    # Only element 1 of the call carries f1 -> f2 -> f3; reading element 0 must not inherit it.
    module = critical_path.parse_module(HLO)
    root, kernels = critical_path.chain_through(module, "command_buffer", [None])
    assert kernels == 3
    assert [link.depth for link in root] == [1, 3]
    assert root[1].op_name.endswith("adam/mul")


def test_a_longer_chain_outside_the_call_wins() -> None:
    # Three more fusions after b: a -> b -> g1 -> g2 -> g3 -> add is 6 long.
    extra = (
        "  %g1 = f32[4]{0} fusion(%b), kind=kLoop, calls=%fused_neg\n"
        "  %g2 = f32[4]{0} fusion(%g1), kind=kLoop, calls=%fused_neg\n"
        "  %g3 = f32[4]{0} fusion(%g2), kind=kLoop, calls=%fused_neg\n"
    )
    text = HLO.replace(
        "  %sum = f32[4]{0} add(%b, %cast)\n", extra + "  %sum = f32[4]{0} add(%g3, %cast)\n"
    )
    result = critical_path.analyse(text)
    assert result["depth"] == 6
    assert [k["kernel"].split(" ")[0] for k in result["chain"]] == [
        "a",
        "b",
        "g1",
        "g2",
        "g3",
        "sum",
    ]


def test_an_inner_while_counts_its_body_once_per_trip() -> None:
    # The scan (trip count 7) is picked over an inner loop of 2 trips; the inner body's one
    # kernel then sits twice on the chain.
    inner = (
        "%ibody (ia: (f32[4])) -> (f32[4]) {\n"
        "  %ia = (f32[4]{0}) parameter(0)\n"
        "  %iv = f32[4]{0} get-tuple-element(%ia), index=0\n"
        "  %ik = f32[4]{0} fusion(%iv), kind=kLoop, calls=%fused_neg\n"
        "  ROOT %it = (f32[4]{0}) tuple(%ik)\n"
        "}\n\n"
    )
    text = inner + HLO.replace(
        "  %a = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_neg\n",
        "  %wt = (f32[4]{0}) tuple(%x)\n"
        "  %iw = (f32[4]{0}) while(%wt), condition=%cond, body=%ibody, "
        'backend_config={"known_trip_count":{"n":"2"}}\n'
        "  %ix = f32[4]{0} get-tuple-element(%iw), index=0\n"
        "  %a = f32[4]{0} fusion(%ix), kind=kLoop, calls=%fused_neg\n",
    )
    result = critical_path.analyse(text)
    assert result["body"] == "body"
    assert result["kernels"] == 10  # 8 + the inner kernel twice
    assert result["depth"] == 5  # ik, ik, a, b, sum


def test_a_conditional_gives_each_branch_its_own_operand() -> None:
    # Branch 0 (one kernel) reads x, which three kernels made; branch 1 (two kernels) reads the
    # fresh y. Longest: 3 + 1 = 4 through branch 0, not 3 + 2 = 5 (y is not x's chain).
    text = (
        "HloModule m\n\n"
        "%fn (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n"
        "  ROOT %n = f32[4]{0} negate(%p)\n}\n\n"
        "%br0 (b0: f32[4]) -> f32[4] {\n  %b0 = f32[4]{0} parameter(0)\n"
        "  ROOT %k0 = f32[4]{0} fusion(%b0), kind=kLoop, calls=%fn\n}\n\n"
        "%br1 (b1: f32[4]) -> f32[4] {\n  %b1 = f32[4]{0} parameter(0)\n"
        "  %k1 = f32[4]{0} fusion(%b1), kind=kLoop, calls=%fn\n"
        "  ROOT %k2 = f32[4]{0} fusion(%k1), kind=kLoop, calls=%fn\n}\n\n"
        "%body (a: (s32[], f32[4], f32[4])) -> f32[4] {\n"
        "  %a = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)\n"
        "  %i = s32[] get-tuple-element(%a), index=0\n"
        "  %x0 = f32[4]{0} get-tuple-element(%a), index=1\n"
        "  %y = f32[4]{0} get-tuple-element(%a), index=2\n"
        "  %x1 = f32[4]{0} fusion(%x0), kind=kLoop, calls=%fn\n"
        "  %x2 = f32[4]{0} fusion(%x1), kind=kLoop, calls=%fn\n"
        "  %x = f32[4]{0} fusion(%x2), kind=kLoop, calls=%fn\n"
        "  ROOT %c = f32[4]{0} conditional(%i, %x, %y), branch_computations={%br0, %br1}\n}\n\n"
        "ENTRY %main (e: (s32[], f32[4], f32[4])) -> f32[4] {\n"
        "  %e = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)\n"
        "  ROOT %w = f32[4]{0} while(%e), condition=%fn, body=%body, "
        'backend_config={"known_trip_count":{"n":"3"}}\n}\n'
    )
    result = critical_path.analyse(text)
    assert result["depth"] == 4
    assert [k["kernel"].split(" ")[0] for k in result["chain"]] == ["x1", "x2", "x", "k0"]
    assert result["kernels"] == 5  # x1, x2, x and the larger branch's two


def test_no_while_loop_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no while loop"):
        critical_path.analyse(
            "HloModule m\n\nENTRY %main (p: f32[]) -> f32[] {\n  ROOT %p = f32[] parameter(0)\n}\n"
        )


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--seeds", "0"], 2, "--seeds must be >= 1"),
        (["--set", "network.no_such_field=1"], 2, "no_such_field"),
        (["--hlo", "MISSING"], 2, "no such file"),
        (["--hlo", "NO_WHILE"], "error: ", "no while loop"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(tmp_path, capsys, args, status, message) -> None:
    """Checked before any compile, in this process: argparse's one line (status 2) or
    ``sys.exit``'s message."""
    no_while = tmp_path / "no_while.txt"
    no_while.write_text(
        "HloModule m\n\nENTRY %main (p: f32[]) -> f32[] {\n  ROOT %p = f32[] parameter(0)\n}\n"
    )
    paths = {"NO_WHILE": str(no_while), "MISSING": str(tmp_path / "none.txt")}
    with pytest.raises(SystemExit) as exit_info:
        critical_path.main([paths.get(a, a) for a in args])
    code = exit_info.value.code
    if status == 2:
        assert code == 2 and message in capsys.readouterr().err
    else:
        assert isinstance(code, str) and code.startswith(status) and message in code
