"""The names every part of trainguard relies on: read this package first.

Metric names, label names, alert names, span names and attributes, the event schema, and the
vocabulary of failures and remediation actions with the catalogue that ties them together are
an API: dashboards, alert rules, runbooks, policies and users' own queries depend on them. This
package is the only place that spells them out; everything else imports them from here
(docs/design.md, "Contract"). Renaming anything here needs a note in docs/migrations.md.

One module per section, each re-exported here so that ``from trainguard import contract`` and
``from trainguard.contract import X`` reach every name:

- ``labels``: label names and the vocabularies of their values;
- ``metric``: ``MetricSpec`` and its constructors;
- ``ranks``, ``nodes``, ``remediation``: the metrics of the training ranks, the node exporter
  and the remediation service (with its incident vocabulary and HTTP discovery);
- ``alerts``: alert names, severities, annotations;
- ``failures``: the failure vocabulary and its catalogue, ``FAILURES`` (read this first);
- ``spans``, ``events``, ``logs``: span names and attributes, the event schema, ECS log fields;
- ``env``: environment variables; ``rules``: scrape jobs and recording rule names.

Conventions: prefix ``trainguard_``, base units (seconds, bytes, joules, ratios in 0..1),
``_total`` on counters. Labels never include ``job`` (Prometheus owns it), a step number or a
tensor name (unbounded cardinality).
"""

from trainguard.contract.alerts import *
from trainguard.contract.env import *
from trainguard.contract.events import *
from trainguard.contract.failures import *
from trainguard.contract.labels import *
from trainguard.contract.logs import *
from trainguard.contract.metric import *
from trainguard.contract.nodes import *
from trainguard.contract.ranks import *
from trainguard.contract.remediation import *
from trainguard.contract.rules import *
from trainguard.contract.spans import *
