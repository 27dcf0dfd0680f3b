"""The package's version, in a leaf module: modules below the package face read it from here."""

__version__ = "0.1.0"
