"""What every layer may import: run statuses, errors, the records passed between layers,
settings, input checks, run events as values, log fields and the tracing glue. Nothing
here imports a driver (psycopg, redis, celery): cairn.store is the only home of those.
"""
