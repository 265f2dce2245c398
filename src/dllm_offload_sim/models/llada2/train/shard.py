"""Which rows of a training step's batch one process of a data-parallel run trains on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``world`` processes: of the ``world * n`` rows a single process would draw for a step (windows
    and their noise), this one takes rows ``[rank * n, (rank + 1) * n)``. A run's data and noise therefore depend on
    the global batch and the seed, not on how many processes share them; ``Shard()`` is a single process."""

    rank: int = 0
    world: int = 1

    def __post_init__(self):
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(
                f"rank {self.rank} of world {self.world}: needs world >= 1 and 0 <= rank < world"
            )

    def rows(self, n: int) -> slice:
        """This process's rows of a global batch of ``n`` rows per process."""
        return slice(self.rank * n, (self.rank + 1) * n)

    @property
    def main(self) -> bool:
        """Whether this process logs and writes the run's files (rank 0)."""
        return self.rank == 0
