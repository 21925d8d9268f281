"""The analyses: from the captured graphs, the profile and the live variables to placement.json's
sections (`build` assembles them): transfers, variables, conformance, requests, timing, the op
graph, several tasks merged."""
