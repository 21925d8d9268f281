"""Pinpoint: distributed TensorFlow training that shows where every op, variable and gradient ran."""

__version__ = "0.1.0"
