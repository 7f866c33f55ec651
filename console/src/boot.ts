// boot.js: a classic script the page loads beside app.js. It only starts the route's first
// requests (early.ts), so they are on their way while the app's modules load.
import { startEarly } from './early';

startEarly();
