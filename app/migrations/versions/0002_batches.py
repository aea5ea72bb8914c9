"""batches in the store: durable, resumable background batches

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 19:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('batches',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('owner', sa.String(length=32), nullable=True),
    sa.Column('owner_role', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('policy', sa.JSON(), nullable=False),
    sa.Column('prompts', sa.Integer(), nullable=False),
    sa.Column('budget_samples', sa.Integer(), nullable=False),
    sa.Column('progress', sa.JSON(), nullable=False),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('error', sa.JSON(), nullable=True),
    sa.Column('lease_owner', sa.String(length=32), nullable=True),
    sa.Column('lease_until', sa.Float(), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('takeovers', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batches'))
    )
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.create_index('ix_batches_status_lease', ['status', 'lease_until'], unique=False)
        batch_op.create_index('ix_batches_owner_created', ['owner', 'created_at'], unique=False)

    op.create_table('batch_samples',
    sa.Column('batch_id', sa.String(length=40), nullable=False),
    sa.Column('query_id', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['batch_id'], ['batches.id'], name=op.f('fk_batch_samples_batch_id_batches'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('batch_id', 'query_id', 'seq', name=op.f('pk_batch_samples'))
    )


def downgrade() -> None:
    op.drop_table('batch_samples')
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_index('ix_batches_owner_created')
        batch_op.drop_index('ix_batches_status_lease')
    op.drop_table('batches')
