"""`pinpoint plan`: propose a placement from a measured run, predict its cost, check it after a run.

graph.py is the planner's input (layer groups with measured costs and the edges between them),
read from a run folder; the search, the link model and the prediction work on it alone.
"""
