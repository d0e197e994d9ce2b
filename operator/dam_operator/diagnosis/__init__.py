"""The D·A·M diagnosis engine: pure functions, a window of numbers in, a verdict out."""
