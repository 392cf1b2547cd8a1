import sys

if sys.argv[1:2] == ["train"]:
    # numba asks, as it loads, whether scipy's BLAS is there (for np.dot in jitted code) by
    # importing scipy.linalg: a quarter of a second for every rank of every launch when scipy
    # is installed. No mpips kernel calls BLAS (the network's layers use numpy's), and a
    # training rank uses nothing of scipy.
    sys.modules.setdefault("scipy.linalg.cython_blas", None)

from .cli import main  # noqa: E402

main()
