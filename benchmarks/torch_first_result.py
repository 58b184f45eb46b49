"""Inverting Gradients in PyTorch eager as a whole process: the baseline of the accelerator suite's
``ttfr`` part (time to a first result), run as its own process by ``accelerator.part_ttfr``.

  python benchmarks/torch_first_result.py --model=resnet20-4 --iterations=60 --device=cuda

The attack is gradjax's ``inverting_gradients`` preset's objective in eager PyTorch (1 − cosine of
the parameter gradients, TV 1e-4, signed Adam at lr 0.1, the box [0, 1]) on the zoo model's PyTorch
twin (same layers, PyTorch's own initialisation) and one random image, with the gradient of that
image as the observation. Prints one JSON line of seconds since the interpreter started running this
file: ``torch_import_s`` (import torch), ``twin_import_s`` (importing the twin's definition, which
lives in gradjax's model zoo and so imports JAX and Flax: not PyTorch's cost, subtracted from
``first_result_s``), ``setup_s`` (model, image and observation on the device) and ``attack_s``
(the iterations, synchronised); ``first_result_s`` the process's time to the reconstruction less
``twin_import_s``. The caller adds the interpreter's own start, timed from outside.
"""

import argparse
import json
import time

START = time.perf_counter()


def ig_loop(torch, net, y, observed, dummy, iterations: int):
  """``iterations`` of Inverting Gradients on ``dummy`` (N, C, H, W), which requires grad."""
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  params = [p for p in net.parameters() if p.requires_grad]
  opt = torch.optim.Adam([dummy], lr=0.1)
  observed_norm = sum((o * o).sum() for o in observed).sqrt()
  for _ in range(iterations):
    opt.zero_grad()
    grads = torch.autograd.grad(F.cross_entropy(net(dummy), y), params, create_graph=True)
    dot = sum((g * o).sum() for g, o in zip(grads, observed))
    norm = sum((g * g).sum() for g in grads).sqrt() * observed_norm
    tv = ((dummy[:, :, :, 1:] - dummy[:, :, :, :-1]).abs().mean()
          + (dummy[:, :, 1:, :] - dummy[:, :, :-1, :]).abs().mean())
    (1 - dot / norm + 1e-4 * tv).backward(inputs=[dummy])
    dummy.grad.sign_()
    opt.step()
    with torch.no_grad():
      dummy.clamp_(0, 1)
  return dummy


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="resnet20-4")
  parser.add_argument("--iterations", type=int, default=60)
  parser.add_argument("--device", default="cuda")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  torch_import = time.perf_counter()
  from gradjax import models  # pylint: disable=g-import-not-at-top
  twin_import = time.perf_counter()
  spec = models.family(args.model)
  if spec is None or spec.torch_module is None:
    raise SystemExit(f"error: no PyTorch twin of model {args.model!r}")
  device = torch.device(args.device if args.device != "cuda" or torch.cuda.is_available() else "cpu")
  torch.manual_seed(args.seed)
  net = spec.torch_module(spec.parse(args.model), torch, (32, 32, 3), 10).to(device).eval()
  x = torch.rand((1, 3, 32, 32), device=device)
  y = torch.tensor([3], device=device)
  params = [p for p in net.parameters() if p.requires_grad]
  observed = [g.detach() for g in torch.autograd.grad(F.cross_entropy(net(x), y), params)]
  dummy = torch.randn(x.shape, device=device).clamp_(0, 1).requires_grad_(True)
  if device.type == "cuda":
    torch.cuda.synchronize()
  setup = time.perf_counter()
  ig_loop(torch, net, y, observed, dummy, args.iterations)
  if device.type == "cuda":
    torch.cuda.synchronize()
  end = time.perf_counter()
  twin = twin_import - torch_import
  print(json.dumps({"model": args.model, "iterations": args.iterations, "device": str(device),
                    "torch_import_s": torch_import - START, "twin_import_s": twin,
                    "setup_s": setup - twin_import, "attack_s": end - setup,
                    "first_result_s": end - START - twin}))


if __name__ == "__main__":
  main()
