"""Data sets for the lessons: tiny Shakespeare (download) and a generated coreference corpus."""
