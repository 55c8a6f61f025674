"""replan state

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa
import uuid


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table('store_meta',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    # Job ids are per store; this id tells one store's Slurm jobs from another's on a shared cluster.
    op.bulk_insert(meta, [{'key': 'instance', 'value': uuid.uuid4().hex[:12]}])
    op.create_table('cluster_snapshots',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('taken_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('nodes', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('progress_marks',
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('throughput_observations',
    sa.Column('workload', sa.String(length=200), nullable=False),
    sa.Column('gpu_type', sa.String(length=32), nullable=False),
    sa.Column('samples_per_s', sa.Float(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('workload', 'gpu_type')
    )


def downgrade() -> None:
    op.drop_table('store_meta')
    op.drop_table('throughput_observations')
    op.drop_table('progress_marks')
    op.drop_table('cluster_snapshots')
