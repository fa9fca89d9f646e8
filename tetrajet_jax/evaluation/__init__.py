"""Evaluation: validation perplexity / bits per byte and zero-shot tasks."""

from tetrajet_jax.evaluation.downstream import TaskResult, evaluate_downstream, score_task
from tetrajet_jax.evaluation.perplexity import evaluate_perplexity

__all__ = ["TaskResult", "evaluate_downstream", "evaluate_perplexity", "score_task"]
