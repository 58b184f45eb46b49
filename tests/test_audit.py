"""gradjax.audit without a federation: which attacks ``auto`` picks from a capture's metadata, and an
audit of a capture written as AuditStrategy writes one (a gradjax client's update in PyTorch layout)."""

import json

import jax
import numpy as np
import pytest

from gradjax import audit, clients, interop, models


@pytest.mark.parametrize("metadata, model, attacks", [
    ({"num_samples": 1, "local_lr": "0.1"}, "lenet_zhu", ("idlg",)),
    ({"num_samples": 8, "local_lr": "0.1"}, "lenet_zhu", ("dlg",)),
    ({"num_samples": 8, "local_lr": "0.1", "model": "mlp-1024"}, None, ("exclusive_neurons", "dlg")),
    ({"num_samples": 1, "local_lr": "0.1"}, "mlp", ("exclusive_neurons", "idlg")),
    ({"num_samples": 8, "local_lr": "0.1", "act": "sigmoid"}, "mlp-64", ("dlg",)),
    ({"num_samples": 8, "local_lr": "0.1", "local_batch_size": 4}, "mlp-64",
     ("inverting_gradients_fedavg", "dlm_plus")),
    ({"num_samples": 8}, "mlp-64", ("dlm_plus",)),
])
def test_auto_picks_by_the_update_and_the_model(metadata, model, attacks):
  assert audit.choose_attacks(metadata, model) == attacks


@pytest.mark.slow
def test_an_mlp_client_at_batch_16_leaks_every_image(photos, tmp_path):
  """One local step of an mlp-1024 client on 16 photos, captured as the recorder does: ``auto`` runs
  the closed form first, which recovers every image and label (scored against the photos)."""
  model = models.create("mlp-1024", jax.random.key(3), num_classes=10)
  y = np.arange(16) % 10
  local = clients.LocalTraining(epochs=1, batch_size=None, learning_rate=0.1)
  obs = clients.fedavg(model.apply_fn, model.variables, photos, y, local)
  mapping = interop.zoo_mapping(model)
  weights = tmp_path / "round_weights.safetensors"
  interop.save_weights(weights, model, mapping)
  new = jax.tree.map(lambda w, u: np.asarray(w - u), model.variables["params"], obs.gradient)
  meta = {k: v for k, v in interop.observation_metadata(obs, model).items() if k not in ("layout", "kind")}
  folder = tmp_path / "audit" / "round_1" / "client_7"
  folder.parent.mkdir(parents=True)
  audit.write_capture(folder, str(weights), interop.params_to_torch(new, mapping),
                      {"round": 1, "client": "7", "data_indices": list(range(16))}, meta)
  rows = audit.audit(tmp_path / "audit", audit.Settings(dataset="skimage", image_size=32, iterations=3,
                                                         lpips="none"), log=lambda s: None)
  assert [r["attack"] for r in rows] == ["exclusive_neurons", "dlg"]
  first = rows[0]
  assert first.get("error") is None and first["verdict"] == "leak" and first["psnr"] > 60, first
  assert first["label_accuracy"] == 1.0 and first["num_samples"] == 16
  metrics = json.loads((tmp_path / "audit" / first["run"] / "metrics.json").read_text())
  assert metrics["findings"]["images"]["recognisable"] == 16
  assert metrics["verdict"]["leaks"] == ["images", "labels"]
