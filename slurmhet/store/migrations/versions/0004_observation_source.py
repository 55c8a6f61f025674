"""where a stored throughput came from: a runtime EWMA or `slurmhet profile`

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('throughput_observations') as batch_op:
        batch_op.add_column(sa.Column('source', sa.String(length=16), nullable=False, server_default='ewma'))


def downgrade() -> None:
    with op.batch_alter_table('throughput_observations') as batch_op:
        batch_op.drop_column('source')
