"""Exercise 21 (EXERCISES.md): the group-mean advantage of RL with verifiable rewards.

    python -m exercises group_advantages

The model answered each of P questions K times; each answer got a reward (1 right,
0 wrong). How much better than usual was each answer?
"""
import numpy as np


def group_advantages(rewards, normalize=False):
    """rewards (P, K), a numpy array: K answers to each of P questions -> advantages (P, K), floats.

    An answer's advantage is its reward minus the mean reward of the K answers to its own
    question (its "group"). With normalize=True, also divide each group by its standard
    deviation (np.std's, ddof=0), where that is not 0: a group whose answers all scored the
    same keeps advantages of 0.

    group_advantages([[1, 0, 0, 1]]) -> [[0.5, -0.5, -0.5, 0.5]]
    """
    raise NotImplementedError
