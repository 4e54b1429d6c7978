"""rocketstore's data pipeline on Spark: a PySpark 4 Python Data Source (format
``rocketstore``) that reads topics in batch and in Structured Streaming and writes
DataFrames back, with executors on this host mapping the store's files and executors
anywhere talking to its ZeroMQ sockets.
"""
