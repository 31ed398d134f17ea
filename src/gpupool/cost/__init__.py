"""Cost review (成本复盘): metering, chargeback, reports and capacity forecasts.

Why a package of its own: every number here is derived, read-only, from what the store already
keeps (workload rows, their phase events, the audit chain), so cost never needs a write path of
its own and can run against a live service's database or a simulator's history alike.

- ``history``: the store's rows and events back as exact run and wait intervals;
- ``metering``: allocated (and simulated used) GPU-seconds per run, clipped and rolled up;
- ``policy``: the optional CostPolicy file (priority multipliers, idle spreading, retention);
- ``chargeback``: prices, idle, waiting cost, preemption loss, reconciled to the cent;
- ``reports``: the usage, chargeback and weekly reports as plain data, and their renderers;
- ``render``: any report as text, CSV, JSON or HTML, from the pieces in ``tables``
  (``weekly`` renders the weekly report's own page from them too);
- ``forecast``: demand forecast, GPUs needed for a wait target, and TCO.
"""
