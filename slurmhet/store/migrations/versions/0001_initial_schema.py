"""initial schema

Revision ID: 0001
Revises: 
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('jobs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('state', sa.Enum('PENDING', 'SUBMITTED', 'RUNNING', 'SUBMIT_FAILED', 'COMPLETED', 'FAILED', 'CANCELLED', name='jobstate', native_enum=False, length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('plan', sa.JSON(), nullable=True),
    sa.Column('predicted_jct_s', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_owner'), ['owner'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_state'), ['state'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_job_id'), ['job_id'], unique=False)

    op.create_table('slurm_jobs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('slurm_job_id', sa.String(length=32), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('round', sa.Integer(), nullable=False),
    sa.Column('array_task', sa.Integer(), nullable=True),
    sa.Column('het_offset', sa.Integer(), nullable=True),
    sa.Column('gpu_type', sa.String(length=32), nullable=True),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('nodes', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('exit_code', sa.String(length=16), nullable=True),
    sa.Column('alloc_tres', sa.Text(), nullable=False),
    sa.Column('submitted_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('argv', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id', 'slurm_job_id', 'array_task', 'het_offset', name='uq_slurm_part')
    )
    with op.batch_alter_table('slurm_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_slurm_jobs_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_slurm_jobs_slurm_job_id'), ['slurm_job_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('slurm_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_slurm_jobs_slurm_job_id'))
        batch_op.drop_index(batch_op.f('ix_slurm_jobs_job_id'))

    op.drop_table('slurm_jobs')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_job_id'))

    op.drop_table('events')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_state'))
        batch_op.drop_index(batch_op.f('ix_jobs_owner'))

    op.drop_table('jobs')
