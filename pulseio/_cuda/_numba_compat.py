"""numba-cuda 0.30 calls `np.row_stack`, which numpy 2.5 removed: alias it before `numba.cuda` loads.

The one place pulseio patches a third-party module; import this module before `numba.cuda`.
"""

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
