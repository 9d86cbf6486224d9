SELECT count(*) AS pending FROM outbox WHERE status = 'pending' AND notifier IN (SELECT unnest($notifiers::VARCHAR[]));
