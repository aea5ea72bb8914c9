"""recordings keep each sample's token-confidence trace (when top log-probs were asked for)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 22:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('recordings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('traces', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('recordings', schema=None) as batch_op:
        batch_op.drop_column('traces')
