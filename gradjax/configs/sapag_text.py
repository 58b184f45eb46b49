"""SAPAG's text experiment (Wang et al.; DLG's Table 2 protocol): SAPAG's Transformer (2 encoder
layers, 4 heads, feed-forward 200, GELU, width 200) trained by one client on one 15-token sentence of
Python's documentation (``pydoc``), FedSGD; the attack is ``presets.sapag()`` at 500 L-BFGS iterations
(the budget of ``gradjax text-table``'s rows). LPIPS does not apply to text."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.data.modality = "text"
  c.data.dataset = "pydoc"
  c.data.sequence_length = 15
  c.model.name = "transformer"
  c.attack.preset = "sapag"
  c.attack.iterations = 500
  c.output.lpips = "none"
  return c
