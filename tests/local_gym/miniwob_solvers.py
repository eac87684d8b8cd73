"""The MiniWoB++ DOM solvers, where the tests and bench/miniwob_reference.py import them from: they live in the
package (cua_rl/local_gym/miniwob_solvers.py) since the SFT demonstrator plays them too."""

from cua_rl.local_gym.miniwob_solvers import SOLVERS, Play, Solver, by_text, quoted, solves  # noqa: F401
