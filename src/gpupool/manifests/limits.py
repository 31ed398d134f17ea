"""The stated limits on what a user may send: one place, so the CLI, the API and the docs agree.

Why limits at all: a file or request past these is either a mistake or an attack (a YAML
"billion laughs" expands 1 KiB into 10^9 nodes), and refusing it early, naming the limit, is
better than a server or CLI that never answers. docs/service.md ("Limits") lists them.
"""

from __future__ import annotations

from typing import Final

#: aliases (``*name``) in one YAML document; a manifest rarely needs any
MAX_YAML_ALIASES: Final = 1_000
#: nodes (mappings, sequences, scalars) of one YAML document once every alias is expanded
MAX_YAML_NODES: Final = 1_000_000
#: nesting of mappings and sequences in one YAML document
MAX_YAML_DEPTH: Final = 64
#: objects in one ``POST /v1/apply`` (and so one ``gpupool apply|submit -f`` set); 413 past it
MAX_APPLY_OBJECTS: Final = 10_000
#: nodes of one Cluster (its node groups' counts plus its listed nodes): Kubernetes' own
#: documented limit for one cluster
MAX_CLUSTER_NODES: Final = 5_000
