"""Plans from measured costs, in plain Python (no Ray): the stage planner, its cost model and
discrete-event simulation, the heterogeneity-aware LP and reliability tiers.
"""
