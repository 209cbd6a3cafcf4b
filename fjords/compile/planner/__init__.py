"""Turn a bound query into its physical plan for the running Fjord (paper section 3.3).

Names, types and clauses are settled once by `fjords.compile.analysis.analyze` (shared with
the Spark compiler); the planner only builds operators from the bound query. The query's simple
filters on its sensor stream go into that stream's shared router (predicate index); what
remains is the query's own short pipeline (`query`: the shapes), its windows (`aggregate`),
joins (`joins`), unions (`union`) and what it may share (`sharing`). The fusion pass
(`fusion`) then decides what runs inside the router and names every stage's output.

The windowed aggregate joined with a table is how the paper's Query 2 runs: aggregating by the
join key before joining keeps the join to a few partial rows per window, and the partials
regroup exactly (COUNT, SUM, AVG, MIN and MAX all merge). NOW in a windowed query is the end of
the window being emitted.
"""

from fjords.compile.planner.query import plan_query

__all__ = ["plan_query"]
