"""The API's routes, one APIRouter per resource, each included by cairn.web.api.create_app:

runs       start, read, list, cancel, resolve, fork, rewind and replay runs
events     a run's events as Server-Sent Events
signals    a signal sent to a run
approvals  the runs waiting on a person, across runs, and a decision on one
schedules  workflows started on a clock
health     /healthz and /metrics, for the operator
pages      the HTML pages of runs and the login
"""
