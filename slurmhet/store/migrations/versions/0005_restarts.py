"""Slurm's requeue count per part

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A preempted job or one whose node failed is requeued by Slurm under its own id: only squeue's
    # restart count tells such runs apart, and status and report show it.
    with op.batch_alter_table('slurm_jobs') as batch_op:
        batch_op.add_column(sa.Column('restarts', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('slurm_jobs') as batch_op:
        batch_op.drop_column('restarts')
