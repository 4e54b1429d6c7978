"""rocketstore's data pipeline on Spark: a PySpark 4 Python Data Source, format
``rocketstore``, that reads topics in batch and in Structured Streaming and writes
DataFrames back, with executors on this host mapping the store's files (option
``store``) and executors anywhere talking to its ZeroMQ sockets (option ``endpoint``).

    from rocketstore.spark import register
    register(spark)
    df = spark.read.format("rocketstore").option("store", "store").option("topic", "T").load()

Modules: ``options`` (the format's options), ``offsets`` (offset specs, ranges, read
limits), ``arrow_codec`` (CommitLog records to Arrow), ``access`` (local and remote
reads), ``source`` (batch and streaming reads), ``sink`` (exactly-once writes),
``demo`` (``rocketstore pipeline demo``).
"""


def register(spark) -> None:
    """Make ``spark.read/readStream/write/writeStream.format("rocketstore")`` available
    in ``spark`` (a SparkSession)."""
    from rocketstore.spark.source import RocketStoreDataSource
    spark.dataSource.register(RocketStoreDataSource)
