"""benchmarks.deviceless: its HLO readings on hand-written HLO, and its error without JAX's CUDA
plugin (CI has none; the compile itself needs the plugin, see the module's docstring)."""

import pytest

from benchmarks import deviceless

HLO = """\
%body (p: (f32[2,3])) -> (f32[2,3]) {
  %p = (f32[2,3]{1,0}) parameter(0)
  %x = f32[2,3]{1,0} get-tuple-element(%p), index=0
  %t = f32[3,2]{0,1} transpose(%x), dimensions={1,0}
  %c = f32[3,2]{1,0} copy(%t)
  %dot.7 = f32[3,3]{1,0} dot(%c, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %dot = f32[2,2]{1,0} dot(%x, %t), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %r = (f32[2,3]{1,0}) tuple(%x)
}
"""


def test_dots_are_listed_in_the_texts_order_with_their_shapes():
    assert deviceless.dots_in_order(HLO) == [("dot.7", "f32[3,3]"), ("dot", "f32[2,2]")]
    assert deviceless.dots_in_order("") == []


def test_copies_are_counted_and_nothing_else():
    assert deviceless.copies(HLO) == 1
    assert deviceless.copies(HLO.replace(" copy(", " negate(")) == 0


@pytest.mark.skipif(deviceless._has_plugin(), reason="JAX's CUDA plugin is installed here")
def test_without_the_cuda_plugin_it_says_what_to_install():
    with pytest.raises(SystemExit) as exit_info:
        deviceless.main(["--seeds", "2"])
    message = str(exit_info.value.code)
    assert "CUDA plugin is not importable" in message
    assert "jax-cuda12-plugin==0.11.2" in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--target-config", "/no/such/target.pbtxt"], "no such file"),
    ],
)
def test_bad_arguments_get_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        deviceless.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
