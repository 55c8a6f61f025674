"""start-up cost per workload

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('startup_observations',
    sa.Column('workload', sa.String(length=200), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('workload')
    )
    # Set once a part's start-up is folded in, so each (job, Slurm job) counts once.
    with op.batch_alter_table('slurm_jobs') as batch_op:
        batch_op.add_column(sa.Column('startup_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('slurm_jobs') as batch_op:
        batch_op.drop_column('startup_s')
    op.drop_table('startup_observations')
