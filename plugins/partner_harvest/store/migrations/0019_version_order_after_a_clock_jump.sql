-- The order of versions after a partner clock jumped back (0010), completed: a version
-- observed by a run whose clock had regressed (rc NOT NULL) and one carrying a stamp
-- later than that clock are ordered by observation, whichever of the two was observed
-- later. 0010 let the later observation win only when the later one was the regressed
-- run's; a version stamped while the clock was still behind, harvested by a run after
-- the clock had passed the old stamps again (not regressed itself), lost for good to the
-- held version stamped before the jump (the soak, seed 2324, soak_sierra_b night 7).
CREATE OR REPLACE FUNCTION harvest_version_newer(
    n_ds timestamptz, n_obs timestamptz, n_rc timestamptz,
    s_ds timestamptz, s_obs timestamptz, s_rc timestamptz
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN (n_rc IS NOT NULL AND s_ds > n_rc) OR (s_rc IS NOT NULL AND n_ds > s_rc) THEN n_obs > s_obs
        ELSE (n_ds, n_obs) > (s_ds, s_obs)
    END
$$;
