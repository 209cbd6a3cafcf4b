"""Operators: state machines with one `transition` step (select, project, aggregate, joins...)."""
