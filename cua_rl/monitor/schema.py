"""The run store's tables, defined once: the ingest validator and the SQLAlchemy tables both read ``FIELDS``.

Why one spec: the server must accept exactly what ``cua_rl.monitor.records`` builds (docs/protocols.md
§4.1), so each ingest kind lists its typed fields here; a field the spec does not know is kept in the row's
``extra`` JSON instead of being refused (the remote monitor's protocol has more columns than we read).
Link fields (``link:<kind>``) hold the monitor's integer id of another row; the ingest also accepts that
row's ``client_id`` there. Times are ISO-8601 strings as the client sends them (they sort as text).

The migration in ``migrations/versions`` freezes its own copy of this spec; change both together.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

# Field kinds: str (short), text (long), int, float, bool, json (any JSON value), jsonstr (a JSON document
# kept as text; objects are serialised), link:<kind> (integer id of a row of that kind).
FIELDS: dict[str, dict[str, str]] = {
    "trainings": {"run_name": "str", "status": "str", "current_phase": "str", "experiment_name": "str",
                  "trial_name": "str", "config_json": "jsonstr", "start_time": "str", "end_time": "str"},
    "tasks": {"task_id": "str", "name": "text", "description": "text", "source_type": "str"},
    "validators": {"name": "str", "validator_type": "str", "config_json": "jsonstr"},
    "environments": {"rollout_id": "link:rollouts", "env_type": "str", "box_type": "str", "gbox_id": "str",
                     "status": "str", "status_message": "text", "creation_time": "str", "termination_time": "str"},
    "steps": {"training_id": "link:trainings", "step": "int", "batch": "int", "status": "str",
              "current_phase": "str", "start_time": "str", "end_time": "str"},
    "baselines": {"training_id": "link:trainings", "step": "int", "model_path": "text", "status": "str",
                  "start_time": "str", "end_time": "str"},
    "evals": {"training_id": "link:trainings", "step": "int", "model_path": "text", "status": "str",
              "start_time": "str", "end_time": "str"},
    "rollouts": {"rollout_id": "str", "training_id": "link:trainings", "step_id": "link:steps",
                 "eval_id": "link:evals", "baseline_id": "link:baselines", "task_id": "link:tasks",
                 "env_id": "str", "source_type": "str", "is_eval": "bool", "batch": "int", "group_num": "int",
                 "env_index": "int", "group_id": "str", "max_turns": "int", "model_path": "text",
                 "status": "str", "current_phase": "str", "current_turn": "int", "start_time": "str",
                 "end_time": "str", "reward": "float", "advantage": "float", "task_success": "bool",
                 "validation_passed": "bool", "num_turns": "int", "summary_json": "jsonstr"},
    "turns": {"rollout_id": "link:rollouts", "turn": "int", "start_time": "str", "end_time": "str",
              "turn_time": "float", "reward": "float", "advantage": "float", "episode_done": "bool",
              "model_response": "jsonstr", "thinking": "text", "text": "text", "action_json": "jsonstr",
              "model_specific_input_json": "jsonstr", "metrics_json": "jsonstr", "screen_before": "str",
              "screen_after": "str", "image_sha256": "str", "tokens_json": "jsonstr"},
    "actions": {"turn_id": "link:turns", "action_type": "str", "action_name": "str", "action_args": "json",
                "action_call_id": "str", "action_json": "jsonstr"},
    "observations": {"turn_id": "link:turns", "obs_type": "str", "screenshot_uri": "text",
                     "model_input_json": "jsonstr"},
    "validations": {"rollout_id": "link:rollouts", "validator_id": "str", "validation_time": "str",
                    "validation_query": "text", "expected_result": "text", "actual_result": "text",
                    "success": "bool", "execution_time": "float", "error_message": "text", "details_json": "json",
                    "screenshot_uri": "text"},
}
# The ingest body's array kinds, in the order a batch is applied (a row may link to an earlier kind).
BATCH_KINDS = ("tasks", "validators", "steps", "baselines", "evals", "rollouts", "environments", "turns",
               "actions", "observations", "validations")
CLIENT_ID_MAX = 256
# Integer columns (and row ids) are 32-bit on PostgreSQL; SQLite's are 64-bit. Values outside the common
# range are refused at ingest (a 500 from the driver otherwise), on both, so a batch means the same on both.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1

metadata = MetaData()

projects = Table(
    "projects", metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("created_at", String(40), nullable=False),
)
# Several tokens per project (one per embedded run, one per teammate...); only their SHA-256 is kept.
tokens = Table(
    "tokens", metadata,
    Column("id", Integer, primary_key=True),
    Column("project_id", Integer, ForeignKey("projects.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("label", String(128), nullable=True),
    Column("created_at", String(40), nullable=False),
)


def _column(name: str, kind: str) -> Column:
    if kind.startswith("link:"):
        return Column(name, Integer, ForeignKey(f"{kind[5:]}.id", ondelete="CASCADE"), nullable=True, index=True)
    sql_type = {"str": String(256), "text": Text, "int": Integer, "float": Float, "bool": Boolean,
                "json": JSON, "jsonstr": Text}[kind]
    return Column(name, sql_type, nullable=True)


def _table(kind: str) -> Table:
    columns = [Column("id", Integer, primary_key=True),
               Column("project_id", Integer, ForeignKey("projects.id"), nullable=False, index=True)]
    if kind != "trainings":
        columns.append(Column("client_id", String(CLIENT_ID_MAX), nullable=False))
    columns += [_column(name, k) for name, k in FIELDS[kind].items()]
    columns.append(Column("extra", JSON, nullable=True))
    args = [UniqueConstraint("project_id", "client_id", name=f"uq_{kind}_client")] if kind != "trainings" else []
    return Table(kind, metadata, *columns, *args)


TABLES: dict[str, Table] = {kind: _table(kind) for kind in FIELDS}
Index("ix_rollouts_group", TABLES["rollouts"].c.group_id)


def link_target(kind: str, field: str) -> str | None:
    spec = FIELDS[kind].get(field, "")
    return spec[5:] if spec.startswith("link:") else None
