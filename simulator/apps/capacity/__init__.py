"""`fairsim-capacity`: the search algorithms (Etalon's, EvalScope's, Veeksha's) in `searches`,
the command and the simulated service it probes in `cli`."""
