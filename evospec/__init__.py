"""evospec: lossless speculative decoding whose drafters keep learning while they serve."""

__version__ = "0.1.0"
