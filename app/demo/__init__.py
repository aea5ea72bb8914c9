"""Demo task for the tiny local model: graded multi-step integer arithmetic."""

from app.demo.problems import (
    BOS,
    EOS,
    LEVELS,
    SEPARATOR,
    Problem,
    chat_messages,
    completion_prompt,
    extract_answer,
    generate,
    is_correct,
    make_set,
    render_training_text,
)

__all__ = [
    "BOS",
    "EOS",
    "LEVELS",
    "SEPARATOR",
    "Problem",
    "chat_messages",
    "completion_prompt",
    "extract_answer",
    "generate",
    "is_correct",
    "make_set",
    "render_training_text",
]
