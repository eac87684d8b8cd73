"""Suite-wide set-up shared by every test folder."""

from cua_rl.logs import keep_stdlib_logging

# AReaL's getLogger detaches the stdlib root logger on every call; without this our loggers (and pytest's
# caplog) stop hearing INFO/WARNING lines as soon as any test module imports areal.
keep_stdlib_logging()
