"""Progress of a restart search, as the driver reports it after every chunk."""

import math
from typing import NamedTuple


class Progress(NamedTuple):
  """Reported before a run's first chunk (``compiling``) and after every chunk."""

  restart: int | None       # the restart being run (sequential strategy), else None (all at once)
  iteration: int
  iterations: int
  best_loss: float
  alive: int
  its_per_s: float          # NaN for the run's first chunk, which includes the step's compilation
  eta_s: float              # seconds the whole run has left (every restart and round); NaN with its_per_s
  elapsed_s: float = 0.0    # since this restart (or these restarts) started advancing
  compiling: bool = False   # True for the report sent before the first step is compiled
  note: str = ""            # on that report: why the restarts run as they do, where the device's
                            # memory chose (gradjax.driver.fit_strategy)

  def line(self) -> str:
    """One progress line: a bar, the objective, restarts alive, rate and ETA (the first chunk's
    time includes compiling the step, so it gets no rate)."""
    where = "" if self.restart is None else f"restart {self.restart} "
    if self.compiling:
      return f"{where}compiling the attack step{f' ({self.note})' if self.note else ''}..."
    filled = round(20 * self.iteration / max(self.iterations, 1))
    rate = self.its_per_s
    speed = (f"{self.elapsed_s:.1f}s with compilation" if math.isnan(rate)
             else f"{rate:.{0 if rate >= 10 else 1}f} it/s  ETA {self.eta_s:.1f}s" if rate >= 1
             else f"{1 / rate:.1f} s/it  ETA {self.eta_s:.1f}s" if rate > 0 else "stalled")
    return (f"{where}[{'#' * filled}{'.' * (20 - filled)}] {self.iteration}/{self.iterations}  "
            f"loss {self.best_loss:.3e}  alive {self.alive}  {speed}")
