"""kubectl-like commands that talk to a gpupool server over HTTP, and where each one lives.

Why a thin client: all rules live in the server (one place to audit); the client only reads
files, picks the server and token (flag > environment > config file > ./.gpupool/admin-token)
and prints results as a table, JSON or YAML. Every failure is one clear line and a non-zero
exit, never a traceback.

The package's modules, by command area (this file imports none of them: each command's module
is loaded when that command runs, gpupool.cli.main says why):

- ``http``: which server and token, and the HTTP call that reports a refusal as one line;
- ``output``: the consoles, ``-o table|json|yaml``, tables and ``fail``;
- ``apply``: ``apply`` and ``submit`` (a whole set of manifests, all or none), registered
  by that module itself: it loads the manifest models, which ``get`` does not need;
- ``objects`` and ``rows``: ``get``, ``describe``, ``delete`` and each kind's table;
- ``workloads``: ``cancel``, ``explain``, ``approve``, ``reject``;
- ``nodes``: ``cordon``, ``drain``;
- ``commands``: registers the commands above that read or change one object by name;
- ``listing``, ``jsonpath``, ``pools``: paging and watching lists, ``-o jsonpath`` and
  ``--sort-by``, a pool's rows;
- ``audit`` and ``tokens``: the ``audit`` and ``token`` command groups (``audit``
  registered by its own module: it loads the audit log's cryptography).
"""
