"""The engine's working state, each piece with its own undo log: the cluster's free capacity
(``cluster.ClusterState``), the quota tree (``quota.QuotaState``), the running set
(``running.RunningSet``), and the one transaction over all three (``statement.Statement``)."""
