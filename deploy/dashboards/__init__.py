"""The chart's Grafana dashboards, as code (grafana-foundation-sdk, Grafana's own builders).

`python -m deploy.dashboards` writes deploy/helm/llmserve/dashboards/*.json; `--check` fails if the
checked-in JSON differs from what the code builds (tests/deploy/test_dashboards.py does the same).
"""
