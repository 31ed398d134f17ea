"""gpupool: a governed GPU compute scheduling platform.

The scheduling engine (``gpupool.engine``) is a pure function of a snapshot; everything
else (simulator, service, backends) is an adapter around it.
"""

__version__ = "0.1.0"
