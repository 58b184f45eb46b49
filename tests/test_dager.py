"""The span attack (gradjax.dager): its linear algebra against NumPy on matrices of known rank, the
decode mode of the text models against their full forward pass, and exact recovery end to end."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, corpus, dager, metrics, models, presets, text
from gradjax.losses import cross_entropy


def _low_rank(rng, d, m, k, n=None, noise=1e-7):
  """Xᵀ G (d, m) with X (k, d) and G (k, m) Gaussian, plus noise of relative size ``noise``."""
  x = rng.normal(size=(k, d))
  g = rng.normal(size=(k, m))
  a = x.T @ g
  return (a + noise * np.linalg.norm(a, 2) * rng.normal(size=a.shape) / np.sqrt(d + m)).astype(np.float32), x


@pytest.mark.parametrize("d,m,k", [(64, 96, 10), (64, 192, 40), (200, 600, 120)])
def test_span_reads_the_rank_and_holds_the_inputs(d, m, k):
  rng = np.random.default_rng(k)
  a, x = _low_rank(rng, d, m, k)
  s = dager.span(a)
  assert s.rank == k and not s.full
  # the basis spans the inputs: principal angles with NumPy's orthonormal basis of the rows of x
  q, _ = np.linalg.qr(x.T)
  cosines = np.linalg.svd(q.T @ np.asarray(s.basis, np.float64), compute_uv=False)
  assert cosines.min() > 1 - 1e-6
  members = np.asarray(dager.distances(s.basis, jnp.asarray(x, jnp.float32)))
  assert members.max() <= s.tolerance
  # NumPy's least-squares residual of random directions, relative: what distances computes
  z = rng.normal(size=(50, d))
  coef, *_ = np.linalg.lstsq(x.T, z.T, rcond=None)
  reference = np.linalg.norm(z.T - x.T @ coef, axis=0) / np.linalg.norm(z, axis=1)
  got = np.asarray(dager.distances(s.basis, jnp.asarray(z, jnp.float32)))
  np.testing.assert_allclose(got, reference, rtol=1e-3, atol=1e-5)
  assert got.min() > 10 * s.tolerance


def test_a_later_gap_is_offered_where_the_largest_leaves_inputs_out():
  """Inputs weighted 1 and 1e-3 ... 2e-6 (a trained model's positions far from its loss): the
  largest fall of the singular values (NumPy's) is after the first input, the wider ranks offered
  are the later falls of at least SEPARATION, the one that holds every input first."""
  rng = np.random.default_rng(5)
  d, m, k = 64, 96, 6
  x = rng.normal(size=(k, d))
  weights = np.array([1, 1e-3, 5e-4, 2e-4, 1e-4, 2e-6])[:, None]
  a = (x.T @ (weights * rng.normal(size=(k, m)))).astype(np.float32)
  s = dager.span(a)
  sv = np.linalg.svd(a.astype(np.float64), compute_uv=False)
  assert s.rank == int(np.argmax(sv[:-1] / sv[1:])) + 1 == 1
  wider = dager._wider_ranks(s)
  assert wider[0] == k
  t = dager.span(a, wider[0])
  assert np.asarray(dager.distances(t.basis, jnp.asarray(x, jnp.float32))).max() <= t.tolerance


def test_a_span_that_fills_the_space_is_full():
  rng = np.random.default_rng(0)
  a, _ = _low_rank(rng, 32, 96, 40)  # 40 inputs in 32 dimensions
  assert dager.span(a).full
  with pytest.raises(ValueError, match="zero"):
    dager.span(np.zeros((4, 6), np.float32))


def test_a_drifting_span_keeps_the_first_steps_inputs():
  """A FedAvg-like sum Σ_k X_kᵀ G_k whose inputs drift by 1e-3 a step: ``drift`` keeps every
  singular value above 10x the median (counted by NumPy here), holds the first step's inputs within
  β / 10 and leaves random directions near β."""
  rng = np.random.default_rng(3)
  d, m, k, steps = 200, 600, 20, 3
  x = rng.normal(size=(k, d))
  xs = [x + 1e-3 * s * rng.normal(size=(k, d)) for s in range(steps)]
  a = sum(xi.T @ rng.normal(size=(k, m)) for xi in xs).astype(np.float32)
  s = dager.span(a, drift=True)
  sv = np.linalg.svd(a.astype(np.float64), compute_uv=False)
  assert s.rank == int(np.sum(sv > 10 * np.median(sv))) and k < s.rank <= steps * k
  assert s.random_level == pytest.approx(np.sqrt(1 - s.rank / d)) and not s.full
  assert s.tolerance == pytest.approx(s.random_level / 10)
  members = np.asarray(dager.distances(s.basis, jnp.asarray(x, jnp.float32)))
  others = np.asarray(dager.distances(s.basis, jnp.asarray(rng.normal(size=(50, d)), jnp.float32)))
  assert members.max() < 1e-3 * s.tolerance and others.min() > 0.8 * s.random_level


@pytest.mark.parametrize("n,d,k", [(300, 40, 17), (30, 64, 12), (200, 50, 50)])
def test_numerical_rank_counts_the_directions_above_float32s_rounding(n, d, k):
  """Rank-k vectors plus a rounding-sized perturbation (1e-6 of their scale, under the threshold
  sqrt(eps32) = 3.5e-4 of the largest singular value): NumPy's matrix_rank at that threshold."""
  rng = np.random.default_rng(n + k)
  x = rng.normal(size=(n, k)) @ rng.normal(size=(k, d))
  x += 1e-6 * np.abs(x).max() * rng.normal(size=x.shape)
  s = np.linalg.svd(x, compute_uv=False)
  want = np.linalg.matrix_rank(x, tol=s[0] * np.sqrt(np.finfo(np.float32).eps))
  assert dager.numerical_rank(x) == want == min(k, d)


def _sentences(rng, vocabulary, batch, length):
  return rng.integers(2, vocabulary, size=(batch, length)).astype(np.int32)


def _loss_gradient(model, x, targets):
  """The client's gradient of the cross entropy of ``model`` on ``x`` against ``targets``, as a
  ``{"params": ...}`` tree; jitted: unjitted, each operation of the backward pass would be compiled
  as a program of its own."""
  loss = lambda p: cross_entropy(model.apply_fn({"params": p}, x), targets)
  return {"params": jax.jit(jax.grad(loss))(model.variables["params"])}


def _gradient(model, ids):
  """The client's gradient of the next-token loss (the last position predicts token 1)."""
  targets = np.concatenate([ids[:, 1:], np.ones((len(ids), 1), np.int32)], axis=1)
  return _loss_gradient(model, ids, targets)


def _model(name, vocabulary, length, dim=64, init=None):
  sizes = models.TextSizes(dim, 4, 2 * dim, 2)
  return models.create(name, jax.random.key(1), input_shape=(length,), num_classes=vocabulary,
                       text_sizes=sizes, init=init)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "transformer"])
def test_decode_mode_reproduces_the_full_forward_pass(name):
  vocabulary, length = 50, 6
  model = _model(name, vocabulary, length)
  ids = _sentences(np.random.default_rng(0), vocabulary, 3, length)
  full = np.asarray(model.apply_fn(model.variables, ids))
  decoder = model.apply_fn.module.clone(decode=True)
  cache = decoder.init(jax.random.key(0), jnp.zeros((3, length), jnp.int32))["cache"]
  steps = []
  for t in range(length):
    logits, updated = decoder.apply({"params": model.variables["params"], "cache": cache},
                                    ids[:, t:t + 1], mutable=["cache"])
    cache = updated["cache"]
    steps.append(np.asarray(logits)[:, 0])
  np.testing.assert_allclose(np.stack(steps, 1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_length_other_than_the_clients_sentences_is_refused():
  """A gpt client's 9-token sentences move the first 9 rows of its learned position table (the
  rows NumPy finds nonzero): the span attack and the token search refuse to read them as 6 tokens
  or as 12;
  a table every row of which moved (noise) tells nothing; sinusoids have no table."""
  model = _model("gpt", 50, 9)
  ids = _sentences(np.random.default_rng(0), 50, 2, 9)
  obs = clients.fedsgd(model.apply_fn, model.variables, ids,
                       np.concatenate([ids[:, 1:], np.ones((2, 1), np.int32)], axis=1))
  g = obs.gradient
  rows = np.flatnonzero(np.abs(np.asarray(g["positions"])).sum(axis=1))
  assert dager.positions_moved(g) == rows[-1] + 1 == 9
  assert dager.positions_moved({"params": g}) == 9
  with pytest.raises(ValueError, match="moved at 9 positions.*more than length=6"):
    dager.recover(model.apply_fn, model.variables, g, length=6)
  with pytest.raises(ValueError, match="moved at 9 positions"):
    text.reconstruct(presets.dlg(iterations=1), model.apply_fn, obs, jax.random.key(0), length=6, eos=1)
  # nor as 12 tokens: positions 9-11 hold none, unless the batch is read as padded
  with pytest.raises(ValueError, match="moved at 9 positions only.*length=12 .pass length=9, or padded"):
    dager.recover(model.apply_fn, model.variables, g, length=12)
  with pytest.raises(ValueError, match=r"moved at 9 positions only.*\(pass length=9\)"):
    text.reconstruct(presets.dlg(iterations=1), model.apply_fn, obs, jax.random.key(0), length=12,
                     eos=1)
  noisy = {**g, "positions": np.asarray(g["positions"]) + 1e-3}
  assert dager.positions_moved(noisy) is None
  assert dager.positions_moved(_gradient(_model("transformer", 50, 9),
                                         _sentences(np.random.default_rng(0), 50, 2, 9))) is None


@pytest.mark.parametrize("name", ["gpt", "transformer", "bert"])
def test_first_block_input_depends_on_its_own_token_only(name):
  """The premise of the first-layer check: changing other positions leaves position t's input."""
  model = _model(name, 50, 6)
  rng = np.random.default_rng(0)
  a = _sentences(rng, 50, 1, 6)
  b = _sentences(rng, 50, 1, 6)
  b[0, 3] = a[0, 3]
  (_, xa), = dager.attention_inputs(model.apply_fn, model.variables, a, count=1)
  (_, xb), = dager.attention_inputs(model.apply_fn, model.variables, b, count=1)
  np.testing.assert_allclose(np.asarray(xa)[0, 3], np.asarray(xb)[0, 3], rtol=1e-6)
  assert not np.allclose(np.asarray(xa)[0, 2], np.asarray(xb)[0, 2])


@pytest.mark.slow
def test_stacked_gradient_is_the_inputs_times_the_output_gradients():
  """[∇W_q ∇W_k ∇W_v] = Xᵀ [G_q G_k G_v], X the captured inputs, G by jax.vjp of the projections."""
  model = _model("gpt", 50, 5, dim=32)
  ids = _sentences(np.random.default_rng(0), 50, 2, 5)
  grad = _gradient(model, ids)
  path = dager.attention_paths(model.apply_fn, model.variables, 5)[0]
  (_, x), = dager.attention_inputs(model.apply_fn, model.variables, ids, count=1)
  x = np.asarray(x, np.float64).reshape(-1, 32)
  stacked = np.asarray(dager.projection_gradient(grad, path), np.float64)
  # the column space of the stacked gradient is the span of the N·T inputs
  q, _ = np.linalg.qr(x.T)
  u = np.linalg.svd(stacked, full_matrices=False)[0][:, :x.shape[0]]
  assert np.linalg.svd(q.T @ u, compute_uv=False).min() > 1 - 1e-4


@pytest.mark.slow
def test_gpt_batches_are_recovered_exactly():
  batch = 4
  vocabulary, length = 300, 8
  model = _model("gpt", vocabulary, length)
  ids = _sentences(np.random.default_rng(batch), vocabulary, batch, length)
  gradient = _gradient(model, ids)
  rec = dager.recover(model.apply_fn, model.variables, gradient, length=length)
  assert rec.stopped_at is None
  scores = metrics.score_text(rec.sentences, ids)
  assert scores["exact"] == batch and scores["unmatched"] == 0 and scores["rouge2"] == 1.0
  assert all(ids[b, t] in rec.position_sets[t] for b in range(batch) for t in range(length))
  # Gaussian noise of 1e-4 on every entry (a defense) leaves no gap in the spectrum: refused, with why.
  leaves, tree = jax.tree.flatten(gradient)
  keys = jax.random.split(jax.random.key(0), len(leaves))
  noisy = jax.tree.unflatten(tree, [g + 1e-4 * jax.random.normal(k, g.shape) for g, k in zip(leaves, keys)])
  with pytest.raises(dager.Unreadable, match="without a clear gap"):
    dager.recover(model.apply_fn, model.variables, noisy, length=length)


@pytest.mark.slow
def test_a_sentence_whose_late_positions_reach_the_gradient_faintly_is_read_in_the_top_t_span():
  """One sentence of T = 8 whose first-block inputs X (T, d) reach the q/k/v gradient Xᵀ G with
  weights 1, 1e-3 ... 3e-6 (a trained model's positions): the largest fall of the singular values
  (NumPy's) reads a rank below T, yet a sentence's T inputs are distinct, so the top-T span holds
  them all and every position's nearest token is the client's. With one input's weight 0 (absent from the
  gradient), the other positions are still read and that one is reported undetermined."""
  vocabulary, length = 300, 8
  model = _model("gpt", vocabulary, length)
  ids = _sentences(np.random.default_rng(2), vocabulary, 1, length)
  (path, x), = dager.attention_inputs(model.apply_fn, model.variables, ids, count=1)
  x = np.asarray(x[0], np.float64)  # (T, d)
  attention = model.variables["params"]
  for key in path:
    attention = attention[key]
  rng = np.random.default_rng(3)

  def gradient(weights):
    tree = jax.tree.map(jnp.zeros_like, model.variables["params"])
    node = tree
    for key in path:
      node = node[key]
    for p in dager.PROJECTIONS:
      shape = attention[p]["kernel"].shape
      g = weights[:, None] * rng.normal(size=(length, int(np.prod(shape[1:]))))
      node[p]["kernel"] = jnp.asarray((x.T @ g).reshape(shape), jnp.float32)
    return {"params": tree}

  weights = np.array([1, 1e-3, 5e-4, 2e-4, 1e-4, 5e-5, 1e-5, 3e-6])
  faint = gradient(weights)
  sv = np.linalg.svd(np.asarray(dager.projection_gradient(faint, path), np.float64), compute_uv=False)
  assert int(np.argmax(sv[:-1] / sv[1:])) + 1 < length
  rec = dager.recover(model.apply_fn, model.variables, faint, length=length)
  np.testing.assert_array_equal(rec.sentences, ids)
  assert rec.undetermined.size == 0 and rec.spans[0].rank == length
  missing = weights.copy()
  missing[5] = 0.0
  rec = dager.recover(model.apply_fn, model.variables, gradient(missing), length=length)
  np.testing.assert_array_equal(np.delete(rec.sentences[0], 5), np.delete(ids[0], 5))
  assert rec.undetermined.tolist() == [5]


@pytest.mark.slow
def test_sapag_transformer_sentence_is_recovered_exactly():
  vocabulary, length = 500, 15
  model = models.create("transformer", jax.random.key(0), input_shape=(length,), num_classes=vocabulary)
  ids = _sentences(np.random.default_rng(0), vocabulary, 1, length)
  rec = dager.recover(model.apply_fn, model.variables, _gradient(model, ids), length=length)
  np.testing.assert_array_equal(rec.sentences, ids)
  assert [len(s) for s in rec.position_sets] == [1] * length  # sinusoids pin each token's position


@pytest.mark.slow
def test_a_batch_wider_than_the_model_is_refused():
  model = _model("gpt", 300, 8, dim=16)
  ids = _sentences(np.random.default_rng(0), 300, 6, 8)  # 48 (token, position) pairs in 16 dimensions
  with pytest.raises(ValueError, match="nearly fills"):
    dager.recover(model.apply_fn, model.variables, _gradient(model, ids), length=8)
  with pytest.raises(ValueError, match=r"eos must be a token id in \[0, 300\), got 305"):
    dager.recover(model.apply_fn, model.variables, _gradient(model, ids), length=8, eos=305)


def test_rouge_agrees_with_rouge_score():
  rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")

  class Words:  # token ids as words, no stemming or filtering
    def tokenize(self, text):
      return text.split()

  scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=Words())
  rng = np.random.default_rng(0)
  for _ in range(30):
    true = rng.integers(0, 6, size=rng.integers(1, 12))
    pred = rng.integers(0, 6, size=rng.integers(1, 12))
    ref = scorer.score(" ".join(f"w{v}" for v in true), " ".join(f"w{v}" for v in pred))
    assert metrics.rouge_n(pred, true, 1) == pytest.approx(ref["rouge1"].fmeasure)
    assert metrics.rouge_n(pred, true, 2) == pytest.approx(ref["rouge2"].fmeasure)
    assert metrics.rouge_l(pred, true) == pytest.approx(ref["rougeL"].fmeasure)


def test_text_scores_assign_fewer_or_more_sentences():
  true = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
  s = metrics.score_text(true[[2, 0]], true)  # the middle sentence missed
  assert s["exact"] == 2 and s["order"] == [1, -1, 0] and s["token_accuracy"] == pytest.approx(2 / 3)
  s = metrics.score_text(np.concatenate([true, [[1, 2, 4]]]), true)  # one extra
  assert s["exact"] == 3 and s["unmatched"] == 1 and s["rougeL"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "transformer"])
def test_cheap_check_is_flax_attention_after_the_prefix(name):
  """output_distances (tokens' projections shared across prefixes) against Flax's own decode step,
  its attention output read at the output projection's input."""
  from flax import linen as nn

  vocabulary, length, t = 40, 6, 3
  model = _model(name, vocabulary, length, dim=32)
  params = model.variables["params"]
  rng = np.random.default_rng(0)
  prefixes, tokens = _sentences(rng, vocabulary, 3, t), np.array([2, 7, 11, 19], np.int32)
  decoder = model.apply_fn.module.clone(decode=True)
  cache = decoder.init(jax.random.key(0), jnp.zeros((3, length), jnp.int32))["cache"]
  for j in range(t):
    _, cache = decoder.apply({"params": params, "cache": cache}, prefixes[:, j:j + 1], mutable=["cache"])
    cache = cache["cache"]
  basis = jnp.asarray(np.linalg.qr(rng.normal(size=(32, 5)))[0], jnp.float32)
  reference = np.zeros((3, 4))
  for p in range(3):
    for s, v in enumerate(tokens):
      seen = []

      def interceptor(next_fun, args, kwargs, context):
        if isinstance(context.module, nn.DenseGeneral) and context.module.name == "out" and not seen:
          seen.append(args[0])
        return next_fun(*args, **kwargs)

      row = jax.tree.map(lambda c: c[p:p + 1] if c.ndim else c, cache)
      with nn.intercept_methods(interceptor):
        decoder.apply({"params": params, "cache": row}, jnp.array([[v]]), mutable=["cache"])
      reference[p, s] = float(dager.distances(basis, seen[0].reshape(1, -1))[0])
  attention = cache["block_0"]["attention"]
  x = dager._inputs_at(model.apply_fn, model.variables, jnp.asarray(tokens), length, t)
  got = dager.output_distances(params["block_0"]["attention"], attention["cached_key"],
                               attention["cached_value"], t, x, basis)
  np.testing.assert_allclose(np.asarray(got), reference, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_pipeline_runs_the_span_attack_and_its_residual_confirms_it():
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
      "attack.preset": "dager", "model.text_dim": 64, "model.text_heads": 4, "model.text_ffn": 128,
      "data.batch_size": 3, "data.sequence_length": 10
  })
  results = text_run.run_text(cfg)
  assert results["exact"] == 3 and results["rouge1"] == 1.0 and results["found"] == 3
  assert results["residual"]["relative_error"] < 1e-5  # the found batch's gradient is the update
  assert results["verdict"]["status"] == "leak"
  text_only = {p: config.option(p).default for p in config.TEXT_ONLY}  # an image run sets none
  for bad in ({"data.modality": "image", "data.dataset": "skimage", "model.name": "lenet_zhu", **text_only},
              {"attack.restarts": 2}):
    with pytest.raises(ValueError, match="dager"):
      config.check(config.replace(cfg, bad))


@pytest.mark.slow
def test_dp_sgd_clipping_keeps_the_span_and_its_noise_hides_it():
  """A DP-SGD client (each sentence's gradient clipped, a bound below every sentence's norm): its
  update is a weighted sum of the same sentences' gradients, so the span attack still reads every
  sentence and the residual recomputed with the clipping is 0; noise of multiplier 1e-3 (ε over
  10^5) already hides the span."""
  from gradjax import clients
  from gradjax.run import config, pipeline, text_run
  options = {"data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
             "attack.preset": "dager", "model.text_dim": 64, "model.text_heads": 4,
             "model.text_ffn": 128, "data.batch_size": 3, "data.sequence_length": 10}
  cfg = config.from_options(options)
  batch = text_run.load_sentences(cfg)
  model = text_run.text_model(cfg, batch.vocabulary, pipeline.experiment_keys(cfg.seed, cfg.data.index)[0])
  x, y = text_run.client_pairs(cfg, model, batch.ids, batch.vocabulary)
  norms = [float(np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(
      clients.gradient(model.apply_fn, model.variables, x[n:n + 1], y[n:n + 1]))))) for n in range(3)]
  bound = 0.5 * min(norms)
  results = text_run.run_text(config.replace(cfg, {"defense.dp_sgd_max_norm": bound}))
  assert results["exact"] == 3 and results["residual"]["relative_error"] < 1e-5
  assert results["verdict"]["status"] == "leak" and results["privacy"]["epsilon"] is None
  noisy = text_run.run_text(config.replace(cfg, {"defense.dp_sgd_max_norm": bound,
                                                 "defense.dp_sgd_noise_multiplier": 1e-3}))
  assert noisy["exact"] == 0 and noisy["privacy"]["epsilon"] > 1e5


@pytest.mark.slow
def test_local_recovery_replays_each_mini_batch_and_stops_where_one_is_missing(monkeypatch):
  """recover_local reads mini-batch 2 from W_1 = W_0 − η ∇L(mini-batch 1) (the gradient taken here
  directly), and stops, with the mini-batches found, where a step finds no new sentence."""
  from gradjax import clients
  model = _model("gpt", 20, 3)
  seen = []

  def fake(apply_fn, variables, update, **kwargs):
    seen.append(variables["params"])
    return dager.Recovery(np.array([[5, 6, 7]], np.int32), np.zeros(1), [], (), None, False)

  monkeypatch.setattr(dager, "recover", fake)
  rec = dager.recover_local(model.apply_fn, model.variables, model.variables, length=3, eos=1,
                            local=clients.LocalTraining(1, 1, 0.1), num_samples=2)
  assert rec.mini_batches == 1 and rec.sentences.tolist() == [[5, 6, 7]] and len(seen) == 2
  ids, targets = np.array([[5, 6, 7]]), np.array([[6, 7, 1]])
  grad = _loss_gradient(model, ids, targets)["params"]
  for a, b, g in zip(jax.tree.leaves(seen[1]), jax.tree.leaves(model.variables["params"]),
                     jax.tree.leaves(grad)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b) - 0.1 * np.asarray(g), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_fedavg_update_of_several_steps_gives_back_the_batch():
  """A FedAvg client of three full-batch local steps (lr 0.05), then of two epochs over two
  mini-batches: the span attack reads the drifting spans (mini-batch by mini-batch), the sentences
  are exact, and replaying the client's training on them gives its update."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
      "attack.preset": "dager", "model.text_dim": 256, "model.text_heads": 4, "model.text_ffn": 512,
      "data.batch_size": 2, "client.name": "fedavg", "client.local_epochs": 3,
      "client.local_lr": 0.05
  })
  results = text_run.run_text(cfg)
  assert results["exact"] == 2 and results["found"] == 2 and results["verdict"]["status"] == "leak"
  assert results["residual"]["relative_error"] < 1e-5
  assert results["spans"][0]["rank"] > 2 * 15  # the later steps' drift counted in the span
  # Mini-batches of 2 over 4 sentences, two epochs: the second mini-batch is read from the weights
  # that replaying the first one's sentences gives.
  results = text_run.run_text(
      config.replace(
          cfg, {"data.batch_size": 4, "client.local_batch_size": 2, "client.local_epochs": 2}))
  assert results["exact"] == 4 and results["mini_batches"] == 2 and results["verdict"]["status"] == "leak"
  assert results["residual"]["relative_error"] < 1e-5
  with pytest.raises(ValueError, match="read by --attack=dager"):
    config.replace(cfg, {"attack.preset": "sapag", "model.name": "transformer"})


@pytest.mark.slow
def test_a_dp_sgd_fedavg_clients_mini_batches_are_read_with_its_clipping_replayed():
  """A DP-SGD FedAvg client (clipping only, the bound half the smallest sentence's norm at the sent
  weights; two epochs over two mini-batches of 2): the first mini-batch is read from the sent
  weights, the second from the weights that replaying the first one's clipped step gives (the
  clipping declared), all four exact, and the update replayed with the clipping is the client's."""
  from gradjax import clients
  from gradjax.run import config, pipeline, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
      "attack.preset": "dager", "model.text_dim": 256, "model.text_heads": 4, "model.text_ffn": 512,
      "data.batch_size": 4, "client.name": "fedavg", "client.local_epochs": 2,
      "client.local_batch_size": 2, "client.local_lr": 0.05})
  batch = text_run.load_sentences(cfg)
  model = text_run.text_model(cfg, batch.vocabulary, pipeline.experiment_keys(cfg.seed, cfg.data.index)[0])
  x, y = text_run.client_pairs(cfg, model, batch.ids, batch.vocabulary)
  norms = [float(np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(
      clients.gradient(model.apply_fn, model.variables, x[n:n + 1], y[n:n + 1]))))) for n in range(4)]
  results = text_run.run_text(config.replace(cfg, {"defense.dp_sgd_max_norm": 0.5 * min(norms)}))
  assert results["exact"] == 4 and results["mini_batches"] == 2 and results["verdict"]["status"] == "leak"
  assert results["residual"]["relative_error"] < 1e-5


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
@pytest.mark.slow
@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_a_captured_pytorch_update_of_the_decoder_gives_back_its_sentences(tmp_path):
  """The zoo's GPT against its PyTorch twin: the server's weights are the twin's; the twin's gradient,
  written and read as a capture, equals gradjax's to 1e-5 of each tensor's scale, and the span
  attack on it returns the client's sentences."""
  torch = pytest.importorskip("torch")
  from gradjax import interop

  vocabulary, length, batch = 60, 8, 3
  sizes = dict(dim=32, heads=4, ffn=64, layers=2)
  model = models.create("gpt", jax.random.key(0), input_shape=(length,), num_classes=vocabulary,
                        text_sizes=models.TextSizes(**sizes))
  mapping = interop.zoo_mapping(model)
  torch.manual_seed(0)
  twin = models.family("gpt").torch_module(None, torch, (length,), vocabulary, **sizes)
  state = {k: v.detach().numpy() for k, v in twin.state_dict().items()}
  interop.write(tmp_path / "w.safetensors", state)
  variables = interop.variables_from_torch(interop.read(tmp_path / "w.safetensors").tensors, mapping,
                                           model.variables)
  ids = _sentences(np.random.default_rng(0), vocabulary, batch, length)
  targets = np.concatenate([ids[:, 1:], np.ones((batch, 1), np.int32)], axis=1)
  logits = twin(torch.tensor(ids, dtype=torch.int64))
  np.testing.assert_allclose(logits.detach().numpy(), np.asarray(model.apply_fn(variables, ids)),
                             rtol=1e-4, atol=1e-5)
  torch.nn.functional.cross_entropy(logits.reshape(-1, vocabulary),
                                    torch.tensor(targets, dtype=torch.int64).reshape(-1)).backward()
  interop.write(tmp_path / "g.safetensors", {k: p.grad.numpy() for k, p in twin.named_parameters()})
  captured = interop.params_from_torch(interop.read(tmp_path / "g.safetensors").tensors, mapping,
                                       model.variables["params"])
  own = jax.grad(lambda p: cross_entropy(model.apply_fn({"params": p}, ids), targets))(
      variables["params"])
  for path, a in jax.tree_util.tree_leaves_with_path(own):
    b = captured
    for key in path:
      b = b[key.key]
    scale = float(np.abs(np.asarray(a)).max()) + 1e-12
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * scale + 1e-9,  # + : the key biases, 0 but for rounding
                               err_msg=jax.tree_util.keystr(path))
  rec = dager.recover(model.apply_fn, variables, {"params": captured}, length=length)
  assert metrics.score_text(rec.sentences, ids)["exact"] == batch


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
@pytest.mark.slow
@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_a_captured_pytorch_update_of_the_encoder_gives_back_its_sentence(tmp_path):
  """The zoo's BERT against its PyTorch twin (masked-LM loss, PyTorch's ignore_index at the
  unmasked positions): the twin's gradient, written and read as a capture, equals gradjax's to 1e-5
  of each tensor's scale, and the span attack with the masked targets returns the sentence."""
  torch = pytest.importorskip("torch")
  from gradjax import interop

  vocabulary, length = 60, 14
  sizes = dict(dim=32, heads=4, ffn=64, layers=2)
  model = models.create("bert", jax.random.key(0), input_shape=(length,), num_classes=vocabulary,
                        text_sizes=models.TextSizes(**sizes))
  mapping = interop.zoo_mapping(model)
  torch.manual_seed(0)
  twin = models.family("bert").torch_module(None, torch, (length,), vocabulary, **sizes)
  interop.write(tmp_path / "w.safetensors", {k: v.detach().numpy() for k, v in twin.state_dict().items()})
  variables = interop.variables_from_torch(interop.read(tmp_path / "w.safetensors").tensors, mapping,
                                           model.variables)
  ids = _sentences(np.random.default_rng(1), vocabulary - 1, 1, length)
  x, y = corpus.masked_lm_pairs(ids, vocabulary - 1, 0.15, seed=2)
  logits = twin(torch.tensor(x, dtype=torch.int64))
  np.testing.assert_allclose(logits.detach().numpy(), np.asarray(model.apply_fn(variables, x)),
                             rtol=1e-4, atol=1e-5)
  torch.nn.functional.cross_entropy(logits.reshape(-1, vocabulary),
                                    torch.tensor(y, dtype=torch.int64).reshape(-1),
                                    ignore_index=-1).backward()
  interop.write(tmp_path / "g.safetensors", {k: p.grad.numpy() for k, p in twin.named_parameters()})
  captured = interop.params_from_torch(interop.read(tmp_path / "g.safetensors").tensors, mapping,
                                       model.variables["params"])
  own = jax.grad(lambda p: cross_entropy(model.apply_fn({"params": p}, x), y))(variables["params"])
  for path, a in jax.tree_util.tree_leaves_with_path(own):
    b = captured
    for key in path:
      b = b[key.key]
    scale = float(np.abs(np.asarray(a)).max()) + 1e-12
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * scale + 1e-9,  # + : the key biases, 0 but for rounding
                               err_msg=jax.tree_util.keystr(path))
  rec = dager.recover(model.apply_fn, variables, {"params": captured}, length=length)
  targets, residual = dager.masked_targets(model.apply_fn, variables, {"params": captured},
                                           rec.sentences, vocabulary - 1)
  np.testing.assert_array_equal(np.where(targets >= 0, targets, rec.sentences), ids)
  assert residual < 1e-4


@pytest.mark.slow
def test_a_batch_too_long_to_order_still_leaks_its_words():
  """gpt of width 200 at batch 16 of 15 tokens: 240 prefixes fill the second block's span, the
  first block's still gives the batch's words; the verdict is a leak of the bag, not an error."""
  from gradjax.run import config, text_run
  results = text_run.run_text(
      config.from_options({
          "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
          "attack.preset": "dager", "data.batch_size": 16
      }))
  sentences = text_run.load_sentences(
      config.from_options({
          "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
          "data.batch_size": 16
      }))
  words = set(sentences.vocabulary.decode(np.unique(sentences.ids)))
  assert "nearly fills" in results["unreadable"] and results["found"] == 0
  assert set(results["words"]) == words and results["word_precision"] == 1.0
  assert results["word_recall"] == 1.0 and results["word_recall_per_sentence"] == [1.0] * 16
  # The corpus's as many most frequent words, recomputed in NumPy from the pool's other sentences.
  values, counts = np.unique(sentences.others, return_counts=True)
  guess = values[np.lexsort((values, -counts))[:len(words)]]
  assert results["word_recall_chance"] == pytest.approx(np.isin(sentences.truth, guess).mean())
  assert results["word_recall_chance"] < 0.99
  assert results["verdict"]["status"] == "leak" and results["verdict"]["leaks"] == ["bag"]


@pytest.mark.slow
def test_a_span_that_cannot_be_read_still_gives_the_words_the_embedding_gradient_shows():
  """The encoder transformer at batch 8, whose first block's span the attack cannot read (no
  position sets): the rows of the embedding table the update moved are the batch's words (NumPy's
  set of its tokens), a leak of the bag, not an inconclusive run that reports none."""
  from gradjax.run import config, text_run
  options = {"data.modality": "text", "data.dataset": "pydoc", "model.name": "transformer",
             "attack.preset": "dager", "data.batch_size": 8}
  results = text_run.run_text(config.from_options(options))
  sentences = text_run.load_sentences(config.from_options(options))
  assert results["found"] == 0 and "span" in results["unreadable"]
  assert set(results["words"]) == set(sentences.vocabulary.decode(np.unique(sentences.ids)))
  assert results["word_precision"] == 1.0 and results["word_recall"] == 1.0
  assert results["verdict"]["status"] == "leak" and results["verdict"]["leaks"] == ["bag"]


@pytest.mark.slow
def test_a_masked_language_models_sentence_and_its_masked_tokens():
  """bert at batch 1, 20 tokens, three masked positions, two of them holding the same word: layer 1
  gives the input, <mask> included; the output bias's gradient counts the labels (checked against
  NumPy's softmax of the found input's logits) and the transform kernel's places them; inputs that
  are not the client's leave a residual (or counts that are not integers)."""
  vocabulary, length = 80, 20
  model = _model("bert", vocabulary, length, dim=48)
  mask = vocabulary - 1
  ids = _sentences(np.random.default_rng(4), vocabulary - 1, 1, length)
  x, y = corpus.masked_lm_pairs(ids, mask, 0.15, seed=0)
  at = np.flatnonzero(x[0] == mask)
  ids[0, at[1]] = ids[0, at[0]]  # a repeated label
  y[0, at[1]] = y[0, at[0]]
  g = _loss_gradient(model, x, y)
  rec = dager.recover(model.apply_fn, model.variables, g, length=length)
  np.testing.assert_array_equal(rec.sentences, x)
  logits = np.asarray(model.apply_fn(model.variables, x), np.float64)[0, at]
  p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
  counts = p.sum(axis=0) - 3 * np.asarray(g["params"]["output_bias"], np.float64)
  np.testing.assert_allclose(counts, np.bincount(y[0, at], minlength=vocabulary), atol=1e-4)
  targets, residual = dager.masked_targets(model.apply_fn, model.variables, g, rec.sentences, mask)
  np.testing.assert_array_equal(targets, y)
  assert residual < 1e-5
  # <mask> at other positions: the labels cannot reproduce the transform kernel's gradient
  shifted = np.roll(x, 1, axis=1)
  try:
    assert dager.masked_targets(model.apply_fn, model.variables, g, shifted, mask)[1] > 1e-2
  except dager.Unreadable as e:
    assert "does not count" in str(e)
  with pytest.raises(dager.Unreadable, match="no <mask>"):
    dager.masked_targets(model.apply_fn, model.variables, g, ids, mask)


@pytest.mark.slow
@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_the_pipeline_reads_a_masked_language_models_update():
  """bert through the pipeline: batches of 1 and 2 exact (the masked words from the gradient, the
  found inputs and targets reproducing the update); a FedAvg client is refused (its local steps
  train on next-token targets)."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "bert",
      "attack.preset": "dager", "model.text_dim": 64, "model.text_heads": 4, "model.text_ffn": 128,
      "data.batch_size": 1, "data.sequence_length": 15
  })
  results = text_run.run_text(cfg)
  assert results["exact"] == 1 and results["rouge1"] == 1.0 and results["verdict"]["status"] == "leak"
  assert results["residual"]["relative_error"] < 1e-5 and results["masked_targets_residual"] < 1e-5
  results = text_run.run_text(config.replace(cfg, {"data.batch_size": 2}))
  assert results["exact"] == 2 and results["rouge1"] == 1.0 and results["verdict"]["status"] == "leak"
  assert results["residual"]["relative_error"] < 1e-5 and results["masked_targets_residual"] < 1e-5
  with pytest.raises(ValueError, match="masked language model"):
    config.check(config.replace(cfg, {"client.name": "fedavg"}))


@pytest.mark.slow
def test_a_masked_language_models_dp_sgd_client_is_read_exactly():
  """bert's DP-SGD client (Opacus' per-example weights, tested against Opacus in
  test_dp_sgd_pytorch; clipping only, the bound half the smaller sentence's norm): each sentence's
  terms in the output bias's gradient carry its own clipping factor, so the masked words no longer
  count as integers; read with a scale per sentence (dager._scaled_bag), both sentences are exact
  and the update recomputed with the client's clipping from them is the client's (relative error
  < 1e-5); its DP-SGD is in the results (no noise: ε infinite). Noise of multiplier 1e-3 hides
  the span."""
  from gradjax import clients
  from gradjax.run import config, pipeline, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "bert",
      "attack.preset": "dager", "model.text_dim": 64, "model.text_heads": 4, "model.text_ffn": 128,
      "data.batch_size": 2, "data.sequence_length": 15})
  batch = text_run.load_sentences(cfg)
  model = text_run.text_model(cfg, batch.vocabulary, pipeline.experiment_keys(cfg.seed, cfg.data.index)[0])
  x, y = text_run.client_pairs(cfg, model, batch.ids, batch.vocabulary)
  weights = clients.example_weights(jnp.asarray(y))
  norms = [float(weights[n]) * float(np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(
      clients.gradient(model.apply_fn, model.variables, x[n:n + 1], y[n:n + 1]))))) for n in range(2)]
  assert abs(norms[0] - norms[1]) > 1e-3 * max(norms)  # the two sentences are clipped differently
  bound = 0.5 * min(norms)
  results = text_run.run_text(config.replace(cfg, {"defense.dp_sgd_max_norm": bound}))
  assert results["exact"] == 2 and results["verdict"]["status"] == "leak"
  assert results["residual"]["relative_error"] < 1e-5 and results["masked_targets_residual"] < 1e-5
  assert results["privacy"]["max_norm"] == pytest.approx(bound) and results["privacy"]["epsilon"] is None
  noisy = text_run.run_text(config.replace(cfg, {"defense.dp_sgd_max_norm": bound,
                                                 "defense.dp_sgd_noise_multiplier": 1e-3}))
  assert noisy["exact"] == 0 and noisy["verdict"]["status"] != "leak"


@pytest.mark.slow
def test_an_extension_that_stops_is_inconclusive_with_the_position(monkeypatch):
  from gradjax.run import config, text_run
  stopped = lambda *a, **k: dager.Recovery(np.zeros((0, 15), np.int32), np.zeros(0), [], (), 3, False)
  monkeypatch.setattr(dager, "recover", stopped)
  results = text_run.run_text(
      config.from_options({
          "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
          "attack.preset": "dager", "model.text_dim": 64, "model.text_heads": 4,
          "model.text_ffn": 128
      }))
  assert results["found"] == 0 and results["verdict"]["status"] == "inconclusive"
  assert "at position 3" in results["verdict"]["reason"]


def _second_block_inputs(model, x):
  """The second block's input (N, T, d), float64: the first block's output as Flax records it."""
  record = jax.jit(lambda v, x: model.apply_fn.module.apply(
      v, x, capture_intermediates=True, mutable=["intermediates"])[1]["intermediates"])
  return np.asarray(record(model.variables, x)["block_0"]["__call__"][0], np.float64)


def test_the_encoder_search_distances_are_the_second_blocks_input_where_flax_records_it():
  """Against NumPy's projection on the basis of the first block's output as Flax records it (one
  reference pass over embeddings):
  - context_distances: each (position, token) with every other position holding the mean embedding
    of the sets' tokens; sets of different sizes (padding and splitting into chunks);
  - position_distances (t's query against the sentence's keys and values, one token's block): the
    δ at t of every sentence with each candidate placed at t."""
  vocabulary, length, dim, t = 40, 5, 32, 3
  model = _model("bert", vocabulary, length, dim=dim, init="default")
  rng = np.random.default_rng(3)
  basis = np.linalg.qr(rng.normal(size=(dim, 12)))[0]
  b32 = jnp.asarray(basis, jnp.float32)
  table = np.asarray(model.variables["params"]["embed"]["embedding"])
  sets = [np.sort(rng.choice(vocabulary, size=n, replace=False)).astype(np.int32)
          for n in (3, 1, 4, 2, 5)]
  context = dager.context_distances(model.apply_fn, model.variables, b32, sets, length, chunk=4)
  mean = table[np.unique(np.concatenate(sets))].mean(axis=0)
  pairs = [(p, v) for p, tokens in enumerate(sets) for v in tokens]
  averaged = np.broadcast_to(mean, (len(pairs), length, dim)).copy()
  for i, (p, v) in enumerate(pairs):
    averaged[i, p] = table[v]

  rows = _sentences(rng, vocabulary, 3, length)
  candidates = np.array([3, 9, 17, 20], np.int32)
  (_, x), = dager.attention_inputs(model.apply_fn, model.variables, jnp.asarray(rows), count=1)
  inputs = dager._inputs_at(model.apply_fn, model.variables, jnp.asarray(candidates), length, t)
  one = dager.position_distances(model.variables["params"]["block_0"], x, t, inputs, b32)
  trial = np.repeat(rows[:, None], len(candidates), axis=1)
  trial[:, :, t] = candidates

  z = _second_block_inputs(model, jnp.asarray(np.concatenate(
      [averaged, table[trial.reshape(-1, length)]]), jnp.float32))
  z = np.concatenate([z[np.arange(len(pairs)), [p for p, _ in pairs]], z[len(pairs):, t]])
  want = np.linalg.norm(z - z @ basis @ basis.T, axis=1) / np.linalg.norm(z, axis=1)
  got = np.concatenate([np.concatenate(context), np.asarray(one).reshape(-1)])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_scaled_counts_give_the_labels_of_sentences_clipped_apart():
  """The output bias's gradient of masked rows whose sentences carry scales 1, 0.3 and 0.02 (DP-SGD
  clipping each sentence by its own factor), written out as (1/M) Σ_n α_n Σ_(m in n) (p_m − e_(y_m)):
  dager._scaled_bag gives the labels (one shared by two sentences, one of the lightest sentence
  alone); a gradient that is noise gives none."""
  rng = np.random.default_rng(4)
  vocabulary, sentence = 300, np.array([0, 0, 1, 1, 1, 2])
  labels, alpha = np.array([7, 19, 7, 42, 42, 255]), np.array([1.0, 0.3, 0.02])
  logits = rng.normal(size=(6, vocabulary))
  p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
  bias = sum(alpha[sentence[m]] * (p[m] - np.eye(vocabulary)[labels[m]]) for m in range(6)) / 6
  np.testing.assert_array_equal(dager._scaled_bag(p, sentence, bias, 6), [7, 19, 42, 255])
  assert dager._scaled_bag(p, sentence, rng.normal(size=vocabulary), 6) is None


@pytest.mark.slow
def test_an_encoders_batch_whose_sentences_share_a_position_is_searched():
  """bert at batch 4 whose sentences all end in the same word (a full stop): that position's set
  holds fewer tokens than the batch has sentences, and the search (which keeps N candidates a
  position) repeats them; the four sentences come back exactly."""
  vocabulary, length, batch = 200, 8, 4
  model = _model("bert", vocabulary, length, dim=128, init="default")
  mask = vocabulary - 1
  ids = _sentences(np.random.default_rng(7), vocabulary - 1, batch, length)
  ids[:, -1] = 5
  x, y = corpus.masked_lm_pairs(ids, mask, 0.15, seed=0)
  x[:, -1], y[:, -1] = 5, -1  # the shared word unmasked in every sentence
  rec = dager.recover(model.apply_fn, model.variables, _loss_gradient(model, x, y), length=length)
  assert len(rec.position_sets[-1]) < batch
  assert sorted(map(tuple, rec.sentences.tolist())) == sorted(map(tuple, x.tolist()))


@pytest.mark.slow
def test_a_masked_language_models_batch_is_ordered_against_the_second_block(monkeypatch):
  """bert at batch 4, 8 tokens each, 15 % masked (LeCun-normal weights, under which a width of 64
  mixes the positions as BERT's 0.02 does at 768): layer 1 gives each position the batch's bag (an
  encoder has no causal order), the search against the second block's span gives the four
  sentences exactly, <mask> included, and the gradient places their masked words; every found
  sentence's second-block inputs lie in the span that NumPy's SVD of the gradient gives. A search
  that finds none refuses with each position's candidates."""
  vocabulary, length, batch = 60, 8, 4
  model = _model("bert", vocabulary, length, dim=64, init="default")
  mask = vocabulary - 1
  ids = _sentences(np.random.default_rng(7), vocabulary - 1, batch, length)
  x, y = corpus.masked_lm_pairs(ids, mask, 0.15, seed=0)
  g = _loss_gradient(model, x, y)
  rec = dager.recover(model.apply_fn, model.variables, g, length=length)
  assert max(len(s) for s in rec.position_sets) > batch  # layer 1 alone cannot order them
  assert sorted(map(tuple, rec.sentences.tolist())) == sorted(map(tuple, x.tolist()))
  targets, residual = dager.masked_targets(model.apply_fn, model.variables, g, rec.sentences, mask)
  order = [next(i for i, row in enumerate(rec.sentences.tolist()) if row == r) for r in x.tolist()]
  np.testing.assert_array_equal(targets[order], y)
  assert residual < 1e-5
  path = dager.attention_paths(model.apply_fn, model.variables, length)[1]
  columns = np.asarray(dager.projection_gradient(g, path), np.float64)
  u, s, _ = np.linalg.svd(columns, full_matrices=False)
  u = u[:, :batch * length]
  z = _second_block_inputs(model, rec.sentences).reshape(-1, 64)
  assert (np.linalg.norm(z - z @ u @ u.T, axis=1) / np.linalg.norm(z, axis=1)).max() < 1e-4
  # the descent, with the encoder block's one-position scores and with whole forward passes (any
  # other bidirectional model's), brings the sentences back from two positions changed each
  second = rec.spans[1]
  candidates = np.stack([np.resize(np.unique(x[:, t]), batch) for t in range(length)])
  start = x.copy()
  start[:, [1, 5]] = x[::-1][:, [1, 5]]
  for block in (dager._encoder_block, lambda *a: None):
    monkeypatch.setattr(dager, "_encoder_block", block)
    back, worst = dager._descend(model.apply_fn, model.variables, second.basis, candidates, start,
                                 second.tolerance)
    np.testing.assert_array_equal(back, x)
    assert worst.max() <= second.tolerance
  # a search that finds no sentence refuses with the words (the verdict's bag), not an empty answer
  monkeypatch.setattr(dager, "_descend", lambda *a: (a[4], np.ones(len(a[4]))))
  with pytest.raises(dager.Unreadable, match="found none") as refused:
    dager.recover(model.apply_fn, model.variables, g, length=length)
  assert all(np.isin(x[:, t], s).all() for t, s in enumerate(refused.value.position_sets))


@pytest.mark.slow
def test_settle_finds_the_sentence_whose_gradient_is_the_clients():
  """dager.settle: from a sentence with two wrong tokens, coordinate descent over the open
  positions' sets gives back the client's sentence, its residual at float32's rounding; the start's
  residual is the relative distance of its gradient to the client's (NumPy, float64); two
  positions' tokens exchanged come back by the exchange move, which no single change makes."""
  vocabulary, length = 300, 8
  model = _model("gpt", vocabulary, length)
  ids = _sentences(np.random.default_rng(4), vocabulary, 1, length)
  g = _gradient(model, ids)
  start = ids[0].copy()
  start[2], start[5] = (ids[0, 2] + 1) % vocabulary, (ids[0, 5] + 7) % vocabulary
  candidates = {2: np.array([start[2], 40, ids[0, 2], 41]), 5: np.array([ids[0, 5], start[5]])}
  sentence, residual = dager.settle(model.apply_fn, model.variables, g, start, candidates, eos=1)
  np.testing.assert_array_equal(sentence, ids[0])
  assert residual < 1e-5
  kept, first = dager.settle(model.apply_fn, model.variables, g, start, candidates, eos=1, sweeps=0)
  own = jax.tree.leaves(_gradient(model, start[None]))
  want = np.sqrt(sum(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
                     for a, b in zip(own, jax.tree.leaves(g))))
  want /= np.sqrt(sum(np.sum(np.asarray(b, np.float64) ** 2) for b in jax.tree.leaves(g)))
  np.testing.assert_array_equal(kept, start)
  np.testing.assert_allclose(first, want, rtol=1e-4)
  exchanged = ids[0].copy()  # two positions' tokens exchanged, neither set holding its own
  exchanged[[2, 5]] = ids[0, [5, 2]]
  sentence, residual = dager.settle(model.apply_fn, model.variables, g, exchanged,
                                    {2: np.array([exchanged[2], 40]), 5: np.array([exchanged[5], 41])},
                                    eos=1)
  np.testing.assert_array_equal(sentence, ids[0])
  assert residual < 1e-5


@pytest.mark.slow
@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_the_token_search_takes_over_where_the_spans_give_only_each_positions_words():
  """A one-block Transformer at batch 2: the span attack finds each position's words but cannot
  order them into sentences (Unreadable with its position sets): the pipeline reports the words
  alone.
  With --iterations the token search, each position kept to its own set, orders them: both
  sentences come back word for word (against the corpus's text) and their gradient is the update."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "transformer",
      "model.text_layers": 1, "attack.preset": "dager", "data.batch_size": 2, "data.index": 2,
      "data.sequence_length": 15
  })
  refused = text_run.run_text(cfg)
  assert refused["found"] == 0 and not refused["findings"]["sentences"]["leak"]
  assert refused["findings"]["bag"]["leak"]  # the words, without their order
  assert "orders a batch of several sentences" in refused["unreadable"]
  results = text_run.run_text(config.replace(cfg, {"attack.iterations": 200}))
  assert results["take_over"]["iterations"] == 200 and results["found"] == 2
  # The words the spans gave are reported as without the search, whatever order it finds.
  assert results["words"] == refused["words"] and results["word_recall"] == refused["word_recall"]
  assert refused["bag_recall"] == 0.0 and results["bag_recall"] == 1.0  # the sentences found, in place
  assert [r["recovered"] for r in results["sentences"]] == [r["true"] for r in results["sentences"]]
  assert results["residual"]["relative_error"] < 1e-5 and results["verdict"]["status"] == "leak"


@pytest.mark.slow
def test_a_signal_stops_the_token_search_that_takes_over_and_saves_it(tmp_path, monkeypatch):
  """The token search after the spans runs under the run's saver: a stop asked for (the first
  Ctrl-C or SIGTERM) saves its state and ends the run, where before it ran to its end."""
  import signal
  from gradjax.run import config, resume, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "transformer",
      "model.text_layers": 1, "attack.preset": "dager", "data.batch_size": 2, "data.index": 2,
      "data.sequence_length": 15, "attack.iterations": 200
  })
  monkeypatch.setattr(resume, "stop_requested", lambda: signal.SIGTERM)
  state = resume.StateFile(str(tmp_path / "state.npz"))
  with pytest.raises(resume.Interrupted):
    text_run.run_text(cfg, state=state)
  assert (tmp_path / "state.npz").exists()
  with pytest.raises(ValueError, match="closed form"):
    config.check(config.replace(cfg, {"attack.optimizer": "adam"}))


def test_the_command_line_names_the_library_for_a_captured_text_model(tmp_path):
  """A capture whose metadata name a text model, given to the image pipeline (or with
  --modality=text): one error naming the library's way, not an image shape's."""
  from gradjax import interop
  from gradjax.run import config
  model = models.create("gpt", jax.random.key(0), input_shape=(8,), num_classes=60,
                        text_sizes=models.TextSizes(dim=16, heads=2, ffn=16, layers=1))
  interop.save_weights(tmp_path / "w.safetensors", model)
  interop.write(tmp_path / "g.safetensors", interop.params_to_torch(
      jax.tree.map(np.zeros_like, model.variables["params"]), interop.zoo_mapping(model)),
      {"kind": "gradient"})
  options = {"model.weights": str(tmp_path / "w.safetensors"), "model.name": None,
             "client.observation": str(tmp_path / "g.safetensors")}
  with pytest.raises(ValueError, match="holds the update of a text model .gpt.*gradjax.dager.recover"):
    config.check(config.from_options(options))
  with pytest.raises(ValueError, match="read a text model's capture with the library"):
    config.from_options({**options, "data.modality": "text"})


def _padded_batch(rng, vocabulary, lengths, length):
  return corpus.padded([rng.integers(2, vocabulary, size=n) for n in lengths], length)


@pytest.mark.parametrize("name", ["gpt", "transformer"])
def test_a_padded_clients_gradient_is_its_sentences_own_at_their_lengths(name):
  """The premise of padded reading: with no loss past a sentence's end, a causal model's gradient
  of the padded batch is Σ_i (L_i / M) ∇ of sentence i alone at its own length (M = Σ L_i), so the
  padding reaches no span."""
  vocabulary, length, lengths = 50, 8, (3, 8, 5)
  model = _model(name, vocabulary, length, dim=32)
  ids = _padded_batch(np.random.default_rng(0), vocabulary, lengths, length)
  x, y = corpus.language_model_pairs(ids, 1)
  padded = _loss_gradient(model, x, y)["params"]
  parts = []
  for row, n in zip(ids, lengths):
    xi, yi = corpus.language_model_pairs(row[None, :n], 1)
    parts.append(jax.tree.map(lambda g: n / sum(lengths) * np.asarray(g, np.float64),
                              _loss_gradient(model, xi, yi)["params"]))
  expected = jax.tree.map(lambda *g: sum(g), *parts)
  for a, b in zip(jax.tree.leaves(padded), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=2e-4, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("name,lengths", [("gpt", (5, 8, 3, 6, 8, 2)), ("transformer", (4, 7)),
                                          ("gpt", (5,))])
def test_a_padded_batch_is_read_by_extension_with_each_sentences_length(name, lengths):
  vocabulary, length = 300, 8
  model = _model(name, vocabulary, length)
  ids = _padded_batch(np.random.default_rng(len(lengths)), vocabulary, lengths, length)
  x, y = corpus.language_model_pairs(ids, 1)
  gradient = _loss_gradient(model, x, y)
  rec = dager.recover(model.apply_fn, model.variables, gradient, length=length, padded=True)
  assert rec.stopped_at is None and len(rec.sentences) == len(lengths)
  # the same rows as the batch, PAD past each end (sorted: the order found is not the batch's)
  assert sorted(map(tuple, rec.sentences.tolist())) == sorted(map(tuple, ids.tolist()))
  scores = metrics.score_text(rec.sentences, ids)
  assert scores["exact"] == len(lengths) and scores["unmatched"] == 0
  if len(lengths) > 1:  # read as sentences of one length, the shorter ones are lost
    unpadded = dager.recover(model.apply_fn, model.variables, gradient, length=length)
    assert len(unpadded.sentences) < len(lengths)


def test_a_padded_batch_needs_a_causal_model():
  model = _model("bert", 50, 6, dim=32)
  with pytest.raises(ValueError, match="causal model"):
    dager.recover(model.apply_fn, model.variables, model.variables, length=6, padded=True)


@pytest.mark.slow
def test_the_pipeline_reads_a_padded_batch_and_its_residual_confirms_it():
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
      "attack.preset": "dager", "model.text_dim": 64, "model.text_heads": 4, "model.text_ffn": 128,
      "data.batch_size": 4, "data.sequence_length": 10, "data.min_length": 4
  })
  batch = text_run.load_sentences(cfg)
  lengths = corpus.lengths(batch.ids)
  assert lengths.min() >= 4 and len(set(lengths.tolist())) > 1  # the batch is padded
  results = text_run.run_text(cfg)
  assert results["exact"] == 4 and results["found"] == 4 and results["rouge2"] == 1.0
  assert results["residual"]["relative_error"] < 1e-5
  assert results["verdict"]["status"] == "leak"
  for bad, match in (({"data.min_length": 11}, "min_length must lie"),
                     ({"attack.preset": "sapag"}, "read by --attack=dager"),
                     ({"attack.iterations": 10}, "drop --iterations"),
                     ({"model.name": "bert"}, "causal model"),
                     ({"model.text_layers": 1}, "at least 2")):
    with pytest.raises(ValueError, match=match):
      config.check(config.replace(cfg, bad))


@pytest.mark.slow
def test_a_padded_batchs_unexplained_inputs_count_what_the_sentences_found_miss():
  """The second span's rank counts the batch's distinct prefixes: a sentence missed (the prefix cap
  at 1 keeps one first token) leaves its prefixes unexplained; a sentence that is another's start
  adds none, so it is lost with nothing unexplained."""
  vocabulary, length = 300, 8
  model = _model("gpt", vocabulary, length)

  def read(sentences, **options):
    ids = corpus.padded(sentences, length)
    gradient = _loss_gradient(model, *corpus.language_model_pairs(ids, 1))
    return dager.recover(model.apply_fn, model.variables, gradient, length=length, padded=True,
                         **options)

  rec = read([[5, 6, 7, 8], [20, 21, 22]])
  assert len(rec.sentences) == 2 and rec.unexplained == 0
  rec = read([[5, 6, 7, 8], [20, 21, 22]], max_prefixes=1)
  assert rec.capped and len(rec.sentences) == 1
  assert rec.unexplained == 7 - int(np.sum(rec.sentences[0] != corpus.PAD))
  rec = read([[5, 6, 7], [5, 6, 7, 8, 9], [20, 21, 22, 23]])
  assert sorted(corpus.lengths(rec.sentences).tolist()) == [4, 5] and rec.unexplained == 0


@pytest.mark.slow
@pytest.mark.parametrize("sentences", [
    [[5, 6, 7], [5, 6, 7, 8, 9], [20, 21, 22, 23]],           # a sentence another's start
    [[5, 6], [5, 6, 7], [5, 6, 7, 8, 9]],                     # two of them
    [[5, 6, 7, 8, 9, 1, 2, 3], [20, 21, 22, 23, 24, 25, 26, 27], [5, 6, 7, 8, 9, 1, 2, 3]],  # a repeat
])
def test_sentences_that_leave_no_input_of_their_own_are_completed_by_the_gradient(sentences):
  """What the spans cannot give (a repeat; of a padded batch, a sentence that is another's start)
  is added where the gradient of the batch with it is the update; a noisy update settles on none."""
  vocabulary, length = 300, 8
  model = _model("gpt", vocabulary, length)
  ids = corpus.padded(sentences, length)
  gradient = _loss_gradient(model, *corpus.language_model_pairs(ids, 1))
  rec = dager.recover(model.apply_fn, model.variables, gradient, length=length,
                      padded=any(len(s) < length for s in sentences))
  assert len(rec.sentences) < len(sentences)
  full, residual = dager.complete(model.apply_fn, model.variables, gradient, rec.sentences,
                                  count=len(sentences), eos=1)
  assert sorted(map(tuple, full.tolist())) == sorted(map(tuple, ids.tolist()))
  assert residual <= dager.SETTLED
  leaves, tree = jax.tree.flatten(gradient)
  keys = jax.random.split(jax.random.key(0), len(leaves))
  noisy = jax.tree.unflatten(tree, [g + 1e-3 * jnp.std(g) * jax.random.normal(k, g.shape)
                                    for g, k in zip(leaves, keys)])
  kept, _ = dager.complete(model.apply_fn, model.variables, noisy, rec.sentences,
                           count=len(sentences), eos=1)
  np.testing.assert_array_equal(kept, rec.sentences)


@pytest.mark.slow
def test_a_branch_that_ends_near_the_tolerance_is_not_kept_as_a_sentence():
  """A vocabulary of 50 words (the others <unk>, repeated): a branch passes the checks near their
  tolerance and ends (read as one length it would die); it holds prefixes the span does not, so it
  is dropped and the batch found is the client's (its gradient the update)."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt", "attack.preset": "dager",
      "data.batch_size": 8, "data.sequence_length": 15, "data.min_length": 6, "data.vocab_size": 50})
  results = text_run.run_text(cfg)
  assert results["found"] == 8 and results["unexplained_inputs"] == 0
  assert results["residual"]["relative_error"] < 1e-5



@pytest.mark.slow
def test_the_pipeline_completes_a_padded_batch_whose_sentence_is_anothers_start():
  """pydoc's sentences 427-430 of 1 to 15 tokens: one is the start of another; the spans give three,
  the gradient the fourth."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt", "attack.preset": "dager",
      "data.batch_size": 4, "data.index": 427, "data.sequence_length": 15, "data.min_length": 1,
      "model.text_dim": 64, "model.text_heads": 4, "model.text_ffn": 128})
  batch = text_run.load_sentences(cfg)
  starts = [a for a in batch.words for b in batch.words if a != b and b[:len(a)] == a]
  assert starts  # the premise: a sentence of the batch starts another
  results = text_run.run_text(cfg)
  assert results["completed"] == 1 and results["exact"] == 4
  assert results["residual"]["relative_error"] < 1e-5


def test_misuse_of_the_span_attack_is_one_clear_line():
  model = _model("gpt", 50, 6, dim=32)
  ids = _sentences(np.random.default_rng(0), 50, 2, 6)
  observation = clients.fedsgd(model.apply_fn, model.variables, *corpus.language_model_pairs(ids, 1))
  for call, message in (
      (lambda: dager.recover(model.apply_fn, model.variables, observation, length=6), "observation.gradient"),
      (lambda: dager.recover(model.apply_fn, model.variables, observation.gradient, length=6,
                             tokens=[1.5, 4.0]), "must be integers"),
      (lambda: dager.complete(model.apply_fn, model.variables, observation.gradient, ids, count=1,
                              eos=1), "cannot hold the 2 found"),
      (lambda: dager.complete(model.apply_fn, model.variables, observation.gradient,
                              dager.Recovery(ids, np.zeros(2), [], (), None, False), count=2, eos=1),
       "recovery.sentences")):
    with pytest.raises(ValueError, match=message):
      call()


@pytest.mark.slow
def test_a_padded_batch_read_as_one_length_leaves_inputs_unexplained():
  """Read without padded=True, a padded batch's shorter sentences are lost: the second span holds
  their prefixes, which the unexplained count names."""
  vocabulary, length = 300, 8
  model = _model("gpt", vocabulary, length)
  ids = _padded_batch(np.random.default_rng(3), vocabulary, (4, 8, 6), length)
  gradient = _loss_gradient(model, *corpus.language_model_pairs(ids, 1))
  rec = dager.recover(model.apply_fn, model.variables, gradient, length=length)
  assert len(rec.sentences) == 1 and rec.unexplained == 4 + 6 - int(ids[0, 0] == ids[2, 0])
