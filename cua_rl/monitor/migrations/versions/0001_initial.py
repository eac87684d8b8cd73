"""Initial run store: projects and their hashed tokens, trainings and the ingest kinds of docs/protocols.md §4.1.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

The field lists are frozen here on purpose (a migration is history): later changes to ``schema.FIELDS``
come with a new revision that alters these tables.
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

FIELDS = {
    "trainings": {"run_name": "str", "status": "str", "current_phase": "str", "experiment_name": "str",
                  "trial_name": "str", "config_json": "jsonstr", "start_time": "str", "end_time": "str"},
    "tasks": {"task_id": "str", "name": "text", "description": "text", "source_type": "str"},
    "validators": {"name": "str", "validator_type": "str", "config_json": "jsonstr"},
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
    "environments": {"rollout_id": "link:rollouts", "env_type": "str", "box_type": "str", "gbox_id": "str",
                     "status": "str", "status_message": "text", "creation_time": "str", "termination_time": "str"},
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


def _column(name, kind):
    if kind.startswith("link:"):
        return sa.Column(name, sa.Integer, sa.ForeignKey(f"{kind[5:]}.id", ondelete="CASCADE"), nullable=True)
    sql_type = {"str": sa.String(256), "text": sa.Text, "int": sa.Integer, "float": sa.Float,
                "bool": sa.Boolean, "json": sa.JSON, "jsonstr": sa.Text}[kind]
    return sa.Column(name, sql_type, nullable=True)


def upgrade() -> None:
    op.create_table("projects",
                    sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("name", sa.String(128), nullable=False, unique=True),
                    sa.Column("created_at", sa.String(40), nullable=False))
    op.create_table("tokens",
                    sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id", ondelete="CASCADE"),
                              nullable=False),
                    sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
                    sa.Column("label", sa.String(128), nullable=True),
                    sa.Column("created_at", sa.String(40), nullable=False))
    op.create_index("ix_tokens_project_id", "tokens", ["project_id"])
    for kind, fields in FIELDS.items():  # dict order = dependency order
        columns = [sa.Column("id", sa.Integer, primary_key=True),
                   sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id"), nullable=False)]
        if kind != "trainings":
            columns.append(sa.Column("client_id", sa.String(256), nullable=False))
        columns += [_column(name, k) for name, k in fields.items()]
        columns.append(sa.Column("extra", sa.JSON, nullable=True))
        if kind != "trainings":
            columns.append(sa.UniqueConstraint("project_id", "client_id", name=f"uq_{kind}_client"))
        op.create_table(kind, *columns)
        op.create_index(f"ix_{kind}_project_id", kind, ["project_id"])
        for name, k in fields.items():
            if k.startswith("link:"):
                op.create_index(f"ix_{kind}_{name}", kind, [name])
    op.create_index("ix_rollouts_group", "rollouts", ["group_id"])


def downgrade() -> None:
    for kind in reversed(list(FIELDS)):
        op.drop_table(kind)
    op.drop_table("tokens")
    op.drop_table("projects")
