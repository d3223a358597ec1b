"""``kvhit sweep``: design grids (engines × capacities × λ0 × replicas × routers × workloads × replications) run
point by point through the service layer, on a local process pool or on a Ray cluster, into a Parquet dataset.

* :mod:`.grid` reads and validates a grid file (TOML) and expands it into tasks with order-independent seeds.
* :mod:`.compute` runs one task by building the service request of each point and calling the service function
  (``kvhit.service``): the sweep re-implements no domain logic.
* :mod:`.store` writes the result rows atomically per batch (temp file + rename) and reads them back for
  ``--resume`` and for the report.
* :mod:`.backends` runs the tasks: a local process pool (``-j``) or Ray tasks (``--backend ray``); workloads are
  shipped to each worker once (fork-inherited initializer payload / ``ray.put``), never per point.
* :mod:`.report` turns a result set into tables and faceted figures.

Invariant: a point's result depends only on the grid file and the point's coordinates — never on the backend, the
number of workers or the order in which points ran (the seed of every point is a hash of the grid seed and the
point's workload coordinates; see :func:`.grid.derive_seed`).
"""

from kvhit.sweep.grid import Grid, GridError, Task, load_grid

__all__ = ["Grid", "GridError", "Task", "load_grid"]
