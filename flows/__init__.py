"""The application: settings, storage and the core wired into the pipeline. Importing it first
gives Prefect the project's defaults for its embedded mode (flows.prefect_defaults)."""

import os

from flows.prefect_defaults import apply_prefect_defaults

apply_prefect_defaults(os.environ)
