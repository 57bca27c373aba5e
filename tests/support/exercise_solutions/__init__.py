"""Reference solutions of EXERCISES.md, kept out of the library: the tests prove
the exercise checks can pass. Learners: try first, peek later."""
