"""``python -m s2d2.cli``: the same as the ``s2d2`` console script."""

from . import main

if __name__ == "__main__":  # pragma: no cover
    main()
