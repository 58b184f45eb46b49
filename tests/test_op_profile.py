"""benchmarks.op_profile: the HLO parser counts a product's FLOPs in closed form, files ops in the
right category, and the profile's figures are the sums and quotients of its per-op times."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import op_profile


def _instructions(fn, *args):
  return op_profile.entry_instructions(jax.jit(fn).lower(*args).compile().as_text())


def test_dot_flops_are_two_m_k_n():
  a, b = jnp.ones((64, 48)), jnp.ones((48, 40))
  found = _instructions(lambda a, b: jnp.tanh(a @ b), a, b)
  matmuls = [v for v in found.values() if v["category"] == "matmul"]
  assert sum(v["flops"] for v in matmuls) == 2 * 64 * 48 * 40


def test_batched_dot_flops_count_the_batch():
  a, b = jnp.ones((3, 16, 8)), jnp.ones((3, 8, 5))
  found = _instructions(lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), a, b)
  assert sum(v["flops"] for v in found.values() if v["category"] == "matmul") == 2 * 3 * 16 * 8 * 5


@pytest.mark.parametrize("stride,dn", [((1, 1), ("NHWC", "HWIO", "NHWC")), ((2, 2), ("NCHW", "OIHW", "NCHW"))])
def test_convolution_flops_are_two_macs_per_output_and_kernel_entry(stride, dn):
  """XLA's convolution (and its weight and input gradients) count 2 · N·Ho·Wo·O · kh·kw·C FLOPs."""
  n, h, c, o, k = 2, 8, 3, 5, 3
  nhwc = dn[0] == "NHWC"
  x = jnp.ones((n, h, h, c) if nhwc else (n, c, h, h))
  w = jnp.ones((k, k, c, o) if nhwc else (o, c, k, k))
  conv = lambda x, w: jax.lax.conv_general_dilated(x, w, stride, "SAME", dimension_numbers=dn)
  ho = -(-h // stride[0])
  macs = n * ho * ho * o * k * k * c
  found = _instructions(conv, x, w)
  assert sum(v["flops"] for v in found.values() if v["category"] == "matmul") == 2 * macs
  dy = jnp.ones(conv(x, w).shape)
  weight_grad = lambda x, w, dy: jax.vjp(lambda w: conv(x, w), w)[1](dy)[0]
  input_grad = lambda x, w, dy: jax.vjp(lambda x: conv(x, w), x)[1](dy)[0]
  counted = [sum(v["flops"] for v in _instructions(f, x, w, dy).values() if v["category"] == "matmul")
             for f in (weight_grad, input_grad)]
  # The input gradient of a stride-s convolution runs on dy dilated by s: s² times the products.
  assert counted == [2 * macs, 2 * macs * stride[0] * stride[1]]


@pytest.mark.parametrize("fn, category", [
    (lambda x: jnp.concatenate([x[:, 1:], x[:, :1]], axis=1) * 1.0, "data movement"),
    (lambda x: jnp.pad(x, 2), "data movement"),
    (lambda x: x.sum(axis=0), "reduction"),
    (lambda x: jnp.exp(x) * 2.0 + 1.0, "elementwise"),
])
def test_ops_are_filed_by_what_they_contain(fn, category):
  found = _instructions(fn, jnp.ones((32, 16)))
  assert {v["category"] for v in found.values()} == {category}


def test_categorize_prefers_matmul_then_reduction_then_movement():
  assert op_profile.categorize({"fusion", "dot", "reduce", "pad"}) == "matmul"
  assert op_profile.categorize({"fusion", "reduce", "pad", "add"}) == "reduction"
  assert op_profile.categorize({"fusion", "slice", "add"}) == "data movement"
  assert op_profile.categorize({"fusion", "add", "exponential"}) == "elementwise"


def test_summarize_sums_categories_and_divides_flops_by_matmul_time():
  instructions = {"d": dict(category="matmul", flops=4e6, op_name="a/Conv_0/dot_general"),
                  "p": dict(category="data movement", flops=0.0, op_name="a/Conv_0/pad"),
                  "e": dict(category="elementwise", flops=0.0, op_name="")}
  out = op_profile.summarize({"d": 2.0, "p": 3.0, "e": 0.5}, instructions, wall_ms=6.0, top=2)
  assert out["categories"] == {"matmul": 2.0, "reduction": 0.0, "data movement": 3.0, "elementwise": 0.5}
  assert out["ops_ms"] == 5.5 and out["matmul_flops"] == 4e6
  np.testing.assert_allclose(out["matmul_gflops"], 4e6 / 2e-3 / 1e9)
  assert [t["op"] for t in out["top"]] == ["p", "d"] and out["top"][1]["source"] == ["Conv_0", "dot_general"]


def test_jax_profile_times_every_thunk_of_a_program():
  a, b = jnp.ones((256, 256)), jnp.ones((256, 256))
  compiled = jax.jit(lambda a, b: jnp.pad(jnp.tanh(a @ b), 1)).lower(a, b).compile()
  out = op_profile.jax_profile(compiled, (a, b), repeats=2)
  assert out["categories"]["matmul"] > 0 and out["matmul_flops"] == 2 * 256 ** 3
  np.testing.assert_allclose(sum(out["categories"].values()), out["ops_ms"], rtol=1e-9)
  assert out["wall_ms"] > 0


@pytest.mark.parametrize("op, category", [
    ("aten::convolution_backward", "matmul"), ("aten::mkldnn_convolution", "matmul"),
    ("aten::addmm", "matmul"), ("aten::mm", "matmul"), ("aten::sum", "reduction"),
    ("aten::_log_softmax", "reduction"), ("aten::copy_", "data movement"), ("aten::t", "data movement"),
    ("aten::cat", "data movement"), ("aten::mul", "elementwise"), ("aten::sigmoid_backward", "elementwise"),
])
def test_torch_ops_are_filed_by_name(op, category):
  assert op_profile.torch_category(op) == category
