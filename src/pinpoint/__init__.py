"""Pinpoint: distributed TensorFlow training that shows where every op, variable and gradient ran."""

from pinpoint.userlog import log

__version__ = "0.1.0"
__all__ = ["log"]
